"""The build's smoke gate with kept results (smoke/keyed_results.py).

Each check runs in a container of its own under the read tracer, all of them at once; a check whose
kept passing run read nothing that differs in this image is not run, its results stand. `resmoke` runs
every check. The report lists the checks in the program's order, whichever way each was answered.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from dataclasses import dataclass

import docker

from builder.engine.image_container import ImageSource, as_source
from builder.lock.smoke_report import SmokeReport
from builder.runtime.smoke.program import CHECKS
from builder.smoke import smoke_gate
from builder.smoke.image_files import ImageFiles
from builder.smoke.keyed_results import KeyedResults, identities, parse_traces, results_of, settings_identity


@dataclass(frozen=True)
class GateOutcome:
    report: SmokeReport
    answers: Mapping[str, Mapping[str, object]]  # check -> the run's record that answered it
    ran: tuple[str, ...]

    @property
    def reused(self) -> tuple[str, ...]:
        return tuple(check for check in CHECKS if check not in self.ran)


def run(image: str | ImageSource, image_id: str, stack: str, files: ImageFiles, config: Mapping[str, object],
        kept: KeyedResults, client: docker.DockerClient, labels: dict[str, str], resmoke: bool) -> GateOutcome:
    settings = settings_identity(config)
    answers: dict[str, Mapping[str, object]] = {}
    for check in () if resmoke else CHECKS:
        hit = kept.reusable(check, files, settings)
        if hit is not None:
            answers[check] = hit
    to_run = tuple(check for check in CHECKS if check not in answers)
    if to_run:
        # All at once: the longest (compile's JIT build) starts first instead of after two others.
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(to_run)) as pool:
            runs = dict(zip(to_run, pool.map(lambda check: smoke_gate.run_traced(image, check, client, labels),
                                             to_run)))
        for check, done in runs.items():
            answers[check] = kept.record(check, image_id, identities(parse_traces(done.traces), files, settings),
                                         done.results)
    results = tuple(result for check in CHECKS for result in results_of(answers[check]))
    return GateOutcome(SmokeReport(as_source(image).name, stack, results), answers, to_run)
