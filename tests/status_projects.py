"""Projects for the `builder status` tests, their locks written through the lock package's own records
(build, smoke, bench) as `builder build`, `builder smoke` and `builder pin --bench` write them, and
the command line run with the network refused.

    regression_project(directory) -> Path   a git checkout whose lock's history holds a passing bench
                                            figure, then a regression; its image then fails a smoke
                                            check, and another row's candidate was rejected
    run_offline(*args, cwd, env)            `builder ARGS` in a process that dies on any network use
    expected_state(entry)                   the state a row's lock entry (or None) is shown in
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from builder.engine.identity import EngineIdentity
from builder.lock import records
from builder.lock.model import ImageRecord, LockedBase
from builder.lock.smoke_report import SmokeReport
from builder.runtime.smoke.report import Result
from checkouts import REPO, link_project_files
from lock_values import IMAGE, OTHER_IMAGE, bench_report

STACK = "sglang-0.5.9-cu128-local"  # built, benched, then failing a smoke check
REJECTED_STACK = "sglang-0.5.9-cu128"  # no image; its candidate failed smoke
FAILED_CHECK = "imports.flashinfer"
ODD_CHECK = "imports.<b>x</b>|y*z"  # a name as a report may hold it: data, never markup
REJECTED_CHECK = "abi.needed-libs.torch"
REPORT = f"build-reports/{STACK}.json"  # the committed build report: its layer sizes
BASE = "sha256:" + "b" * 64
PASSING = {"mode": "baseline", "tok_s": 88.9, "verdict": "pass"}  # 89.5 is the reference, 3% the tolerance
REGRESSION = {"mode": "baseline", "tok_s": 80.0, "verdict": "regression"}
EAGLE = {"mode": "eagle3", "tok_s": 55.0, "verdict": "pass"}  # against 54.1
DATES = ("2026-12-01T10:00:00+00:00", "2026-12-01T12:00:00+00:00", "2026-12-02T09:00:00+00:00")
PATCHES = ("patches.sglang/0001-torch-symm-mem-sm120.patch", "patches.sglang/0002-allreduce-fusion-apply-sm120.patch",
           "patches.flashinfer-python/0001-trtllm-comm-sm120.patch")


def _report(image: str, stack: str, *failing: str) -> SmokeReport:
    names = ["versions.torch", FAILED_CHECK, *PATCHES, "gpu.driver"]
    found = [Result(name, "fail" if name in failing else "skip" if name.startswith("gpu.") else "pass", name)
             for name in names]
    found += [Result(name, "fail", "made to fail") for name in failing if name not in names]
    return SmokeReport(image, stack, tuple(found))


def _commit(root: Path, message: str, date: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", "-C", str(root), "add", "matrix.lock"], check=True)
    subprocess.run(["git", "-C", str(root), "-c", "user.name=status test", "-c", "user.email=status@test.invalid",
                    "commit", "--quiet", "-m", message], check=True, env=env)


def _bench(figure: dict) -> dict:
    references = {"baseline": 89.5, "eagle3": 54.1}
    return {**bench_report(mode=figure["mode"], tok_s=figure["tok_s"], verdict=figure["verdict"], stack=STACK),
            "reference_tok_s": references[figure["mode"]]}


def regression_project(directory: Path) -> Path:
    root = directory
    root.mkdir(parents=True, exist_ok=True)
    for name in ("matrix.toml", "matrix.lock"):
        shutil.copy(REPO / name, root / name)
    link_project_files(root)
    (root / "build-reports").mkdir()
    shutil.copy(REPO / REPORT, root / REPORT)
    lock = root / "matrix.lock"
    subprocess.run(["git", "init", "--quiet", str(root)], check=True)
    base = LockedBase("debian-bookworm", "localhost/builder-base:debian-bookworm", True, image_id=BASE)
    image = ImageRecord(image_id=IMAGE, immutable_tag=f"sglang:0.5.9-cu128-local-{'3' * 12}",
                        tags=(f"sglang:0.5.9-cu128-local-{'3' * 12}", "sglang:0.5.9-cu128-local"),
                        inputs_hash="3" * 64, base=base, source_date_epoch=1767225600, report=REPORT,
                        provenance=f"build-reports/{STACK}.provenance.json", engine=EngineIdentity("buildah", "1.39.3"))
    records.record_build(STACK, image, _report(IMAGE, STACK), lock)
    _commit(root, "built", DATES[0])
    records.record_bench(STACK, _bench(PASSING), path=lock)
    records.record_bench(STACK, _bench(EAGLE), path=lock)
    _commit(root, "benched", DATES[1])
    records.record_bench(STACK, _bench(REGRESSION), path=lock)
    _commit(root, "benched again: a regression", DATES[2])
    # Not committed: the working tree's lock is read after its history.
    records.record_smoke(STACK, _report(IMAGE, STACK, FAILED_CHECK, ODD_CHECK), image_id=IMAGE, path=lock)
    records.record_smoke(REJECTED_STACK, _report(OTHER_IMAGE, REJECTED_STACK, REJECTED_CHECK), image_id=OTHER_IMAGE,
                         path=lock)
    return root


# Any network use ends the process at once (os._exit: no handler can swallow it), naming what it tried.
_OFFLINE = """
import os, runpy, sys
def refuse(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto"):
        sys.stderr.write(f"network use refused: {event} {args!r}\\n")
        sys.stderr.flush()
        os._exit(97)
sys.addaudithook(refuse)
sys.argv = ["builder", *sys.argv[1:]]
runpy.run_module("builder.cli", run_name="__main__", alter_sys=True)
"""


def run_offline(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _OFFLINE, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def expected_state(entry) -> str:
    if entry is None:
        return "not locked"
    outcome = entry.outcome
    if outcome.image is None and outcome.rejected_candidate and not outcome.rejected_candidate.passed:
        return "rejected"
    return outcome.status
