"""Results of the smoke checks: one row per check, shown as a table or as JSON.

Shared by the in-image program and the host side (`builder smoke`), which
reads the JSON back and prints the same table.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

PASS, FAIL, SKIP = "pass", "fail", "skip"
REPORT_SCHEMA = 1
_TABLE_DETAIL_WIDTH = 160


@dataclass(frozen=True)
class Result:
    check: str  # dotted name: "<group>.<subject>", e.g. "abi.needed-libs.torch"
    status: str  # pass | fail | skip
    detail: str  # why: the evidence for a pass, the reason for a fail or skip

    @property
    def group(self) -> str:
        return self.check.split(".", 1)[0]


def passed(check: str, detail: str) -> Result:
    return Result(check, PASS, detail)


def failed(check: str, detail: str) -> Result:
    return Result(check, FAIL, detail)


def skipped(check: str, detail: str) -> Result:
    return Result(check, SKIP, detail)


def summary(results: list[Result]) -> dict[str, int]:
    counts = {PASS: 0, FAIL: 0, SKIP: 0}
    for result in results:
        counts[result.status] += 1
    return counts


def to_json(stack: str, results: list[Result]) -> str:
    """Deterministic JSON: sorted keys, rows in check order, no times."""
    document = {
        "schema": REPORT_SCHEMA,
        "stack": stack,
        "ok": not any(result.status == FAIL for result in results),
        "summary": summary(results),
        "results": [asdict(result) for result in results],
    }
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def from_json(text: str) -> tuple[str, list[Result]]:
    """Parse a report written by to_json; ValueError when it is not one."""
    document = json.loads(text)
    if not isinstance(document, dict) or document.get("schema") != REPORT_SCHEMA:
        raise ValueError("not a smoke report (schema 1)")
    results = [Result(row["check"], row["status"], row["detail"]) for row in document["results"]]
    return document["stack"], results


def format_table(stack: str, results: list[Result]) -> str:
    width = max([len(result.check) for result in results] + [5])
    lines = [f"smoke checks for {stack}", f"{'check':<{width}}  status  detail"]
    for result in results:
        detail = " ".join(result.detail.split())
        if len(detail) > _TABLE_DETAIL_WIDTH:
            detail = detail[:_TABLE_DETAIL_WIDTH - 3] + "..."
        lines.append(f"{result.check:<{width}}  {result.status.upper():<6}  {detail}")
    counts = summary(results)
    lines.append(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped")
    return "\n".join(lines) + "\n"
