"""The smoke checks' report for one image, as the host keeps it: one type from the gate (smoke/smoke_gate.py)
to the lock, the build report, the bump report and the status page. The rows are the in-image program's
(builder.runtime.smoke.report); this module is host-side, so changing it changes no image."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from builder.runtime.smoke.report import FAIL, PASS, SKIP, Result, format_table, summary


@dataclass(frozen=True)
class SmokeReport:
    """One image's results: what `builder build` shows, and what the lock, the build report, the bump
    report and the status page keep and read (one type from the gate to each of them)."""

    image: str
    stack: str
    results: tuple[Result, ...]

    @property
    def passed(self) -> bool:
        return not any(result.status == FAIL for result in self.results)

    def failures(self) -> list[str]:
        return [result.check for result in self.results if result.status == FAIL]

    def counts(self) -> dict[str, int]:
        return summary(list(self.results))

    def table(self) -> str:
        return format_table(f"{self.stack} ({self.image})", list(self.results))

    def to_dict(self) -> dict:
        return {"passed": self.passed, "image": self.image, "stack": self.stack, "summary": self.counts(),
                "results": [asdict(result) for result in self.results]}

    @classmethod
    def from_dict(cls, data: object) -> SmokeReport:
        """The form to_dict writes; ValueError for anything else, or for a verdict its rows deny."""
        if not isinstance(data, dict) or not isinstance(data.get("results"), list) \
                or not all(isinstance(data.get(key), str) for key in ("image", "stack")):
            raise ValueError("a smoke report needs image, stack and results")
        results = []
        for row in data["results"]:
            fields = [row.get(key) if isinstance(row, dict) else None for key in ("check", "status", "detail")]
            if not all(isinstance(field, str) for field in fields) or fields[1] not in (PASS, FAIL, SKIP):
                raise ValueError(f"a smoke report's row is not check, status (pass|fail|skip) and detail: {row!r:.80}")
            results.append(Result(*fields))
        report = cls(data["image"], data["stack"], tuple(results))
        if data.get("passed") is not report.passed:
            raise ValueError(f"the smoke report of {report.image} says passed={data.get('passed')!r}, its rows say "
                             f"{report.passed}")
        return report
