"""`builder bump` and `builder compat refresh`: bad input refused in one line, patch verdicts on the
real sglang and flashinfer wheels, compatibility facts read from the wheels, the report, the workflow."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest
import yaml

from builder.bump import report as bump_report
from builder.bump import compat_refresh
from builder.bump.index import Index
from builder.config import compat
from builder.config.matrix import load_matrix
from builder.lock import records
from builder.lock.model import ImageRecord, LockedBase
from builder.lock.smoke_report import SmokeReport
from builder.patches import patch_verdict
from lock_values import build_report
from builder.runtime.smoke.report import Result

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "patches"


@pytest.fixture
def project(tmp_path):
    """A copy of the project's inputs: a bump that wrongly wrote something writes it here."""
    for name in ("matrix.toml", "matrix.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    for name in ("patches", "templates", "bench", "images"):
        shutil.copytree(REPO / name, tmp_path / name)
    return before_cuda13(tmp_path)


CUDA13_FAMILY = "sglang-0.5.23"


def before_cuda13(root: Path) -> Path:
    """The project as it was before the sglang-0.5.23 family joined the matrix (what these bumps start
    from): its [[stack]], lock rows, patch series and rendered images taken out of the copy at `root`."""
    from builder.bump.stack_text import family_block
    from builder.lock import store

    lines = (root / "matrix.toml").read_text().splitlines(keepends=True)
    start, end = family_block(lines, CUDA13_FAMILY)
    while start > 0 and (lines[start - 1].lstrip().startswith("#") or not lines[start - 1].strip()):
        start -= 1  # the comments above it are its own
    (root / "matrix.toml").write_text("".join(lines[:start] + lines[end:]).rstrip("\n") + "\n")
    lock = store.read(root / "matrix.lock")
    for name in [n for n in lock.stacks if n.startswith(CUDA13_FAMILY + "-")]:
        del lock.stacks[name]
    (root / "matrix.lock").write_text(store.dumps(lock))
    shutil.rmtree(root / "patches" / "sglang" / "0.5.23", ignore_errors=True)
    for rendered in (root / "images").glob(CUDA13_FAMILY + "-*"):
        shutil.rmtree(rendered)
    return root


def _bump(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder.cli", "bump", *args, "--matrix", str(project / "matrix.toml")],
                          capture_output=True, text=True, cwd=project)


def _refused(project: Path, result: subprocess.CompletedProcess, words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("builder: error: ") and words in lines[0], lines
    with tempfile.TemporaryDirectory() as scratch:
        untouched = before_cuda13(shutil.copytree(REPO, Path(scratch) / "untouched", ignore=_only_inputs))
        assert (project / "matrix.toml").read_bytes() == (untouched / "matrix.toml").read_bytes()
        assert (project / "matrix.lock").read_bytes() == (untouched / "matrix.lock").read_bytes()
    assert sorted(p.name for p in (project / "patches" / "sglang").iterdir()) == ["0.5.9"]


def _only_inputs(directory: str, names: list[str]) -> list[str]:
    """shutil.copytree's ignore: of the repository, only what `project` copies."""
    if Path(directory) == REPO:
        return [n for n in names if n not in ("matrix.toml", "matrix.lock", "patches", "images")]
    return []


@pytest.mark.parametrize("args, words", [
    (("sglang==0.5.23", "--from", "sglang-9.9"), "--from sglang-9.9: no stack of that name"),
    (("sglang", "--from", "sglang-0.5.9"), "give PACKAGE==VERSION"),
    (("sglang==0.5.23", "sglang==0.5.10", "--from", "sglang-0.5.9"), "sglang is given twice"),
    (("--from", "sglang-0.5.9"), "give at least one PACKAGE==VERSION"),
    (("sglang==0.5.23",), "give --from STACK"),
    (("--report", "sglang-0.5.77"), "no bump record"),
    (("--report", "sglang-0.5.77", "--from", "sglang-0.5.9"), "--report takes no PACKAGE==VERSION or --from"),
])
def test_bad_arguments_are_one_line_and_exit_2(project, args, words):
    _refused(project, _bump(project, *args), words)


@pytest.mark.network
@pytest.mark.parametrize("args, words", [
    (("no-such-distribution-for-builder-tests==1.0", "--from", "sglang-0.5.9"),
     "unknown package no-such-distribution-for-builder-tests"),
    (("sglang==0.5.999", "--from", "sglang-0.5.9"), "sglang 0.5.999 does not exist"),
    (("sglang==0.5.23", "--from", "sglang-0.5.9", "--name", "sglang-0.5.9"), "already taken"),
])
def test_bad_packages_versions_and_names_are_one_line_and_exit_2(project, args, words):
    _refused(project, _bump(project, *args), words)


@pytest.mark.network
def test_near_bump_carries_every_patch_refreshed_to_the_new_lines():
    verdicts = patch_verdict.judge_series("sglang", "0.5.9", "0.5.10", root=PATCHES)
    assert [(v.name, v.kind) for v in verdicts] == [("0001-torch-symm-mem-sm120.patch", "carried"),
                                                    ("0002-allreduce-fusion-apply-sm120.patch", "carried")]
    fusion = verdicts[1]
    assert "offset +4 lines" in "\n".join(fusion.evidence)  # 0.5.10 moved the imports down
    assert "@@ -69,12 +69,14 @@" in fusion.refreshed  # the refreshed patch names 0.5.10's lines
    assert fusion.refreshed.startswith("Subject: communicator: apply FlashInfer all-reduce fusion on SM120")
    assert all("re-checked" in v.evidence[-1] for v in verdicts)


@pytest.mark.network
def test_far_bump_names_the_hunks_that_need_porting_and_what_upstream_has_now():
    verdicts = {v.name: v for v in patch_verdict.judge_series("sglang", "0.5.9", "0.5.23", root=PATCHES)}
    symm = verdicts["0001-torch-symm-mem-sm120.patch"]
    assert symm.kind == "needs porting" and not symm.refreshed
    text = "\n".join(symm.evidence)
    assert "torch_symm_mem.py: hunk #1 (@@ -47,6 +47,8 @@) FAILED" in text
    assert "10: [4, 6, 8]," in text  # 0.5.23's table, quoted from the wheel
    fusion = verdicts["0002-allreduce-fusion-apply-sm120.patch"]
    assert fusion.kind == "needs porting"
    text = "\n".join(fusion.evidence)
    assert "sglang/srt/layers/communicator.py @@ -92,7 +94,7 @@: the file is not in the new wheel" in text
    assert "sglang/srt/layers/layer_boundary/residual/add_norm.py" in text  # where the check went


@pytest.mark.network
def test_flashinfer_patch_is_dropped_where_upstream_has_its_line():
    (verdict,) = patch_verdict.judge_series("flashinfer-python", "0.6.4", "0.7.2", root=PATCHES)
    assert verdict.kind == "dropped"
    assert any(line.strip().endswith("supported_major_versions=[9, 10, 12]") for line in verdict.evidence)


def test_write_series_lists_only_carried_patches_and_keeps_the_one_to_port(tmp_path):
    shutil.copytree(PATCHES / "sglang", tmp_path / "sglang")
    common = dict(distribution="sglang", old_version="0.5.9", new_version="0.5.99", wheel="w", wheel_sha256="0" * 64)
    verdicts = [patch_verdict.Verdict(name="0001-torch-symm-mem-sm120.patch", kind="needs porting", evidence=(), **common),
                patch_verdict.Verdict(name="0002-allreduce-fusion-apply-sm120.patch", kind="carried", evidence=(),
                                      refreshed="text\n", **common)]
    target = patch_verdict.write_series("sglang", "0.5.9", "0.5.99", verdicts, tmp_path, "build-reports/bump-x.md")
    series = (target / "series").read_text()
    listed = [line for line in series.splitlines() if line and not line.startswith("#")]
    assert listed == ["0002-allreduce-fusion-apply-sm120.patch"]
    assert "# NEEDS PORTING, not applied: 0001-torch-symm-mem-sm120.patch" in series
    assert (target / "0001-torch-symm-mem-sm120.patch.needs-porting").read_bytes() == \
        (PATCHES / "sglang/0.5.9/0001-torch-symm-mem-sm120.patch").read_bytes()
    assert not (target / "0001-torch-symm-mem-sm120.patch").exists()  # never applied by the build
    nothing = [patch_verdict.Verdict(name="0001-torch-symm-mem-sm120.patch", kind="dropped", evidence=(), **common)]
    assert patch_verdict.write_series("sglang", "0.5.9", "0.5.98", nothing, tmp_path, "r") is None


@pytest.mark.network
def test_compat_refresh_derives_the_hand_kept_cuda_facts_from_the_wheels():
    """torch 2.9.1's default-index build is CUDA 12.8 by the hand-kept data; the wheel says so too."""
    index = Index()
    old = compat_refresh.derive("torch", "2.9.1", index)
    assert old.cuda == compat.compat_data()["default_index_cuda"]["torch"]["2.9.1"] == "12.8"
    assert old.wheel_tags == tuple(compat.compat_data()["wheel_tags"]["torch"]["2.9.1"])
    new = compat_refresh.derive("torch", "2.14.1", index)
    assert new.cuda == "13.0" and "cuda-toolkit" in new.cuda_source and "torch-2.14.1-" in new.source
    kernel = compat_refresh.derive("sglang-kernel", "0.4.10", index, {new.key: new})
    assert kernel.cuda == "13" and "torch==2.14.1" in kernel.cuda_source
    sglang = compat_refresh.derive("sglang", "0.5.23", index)
    assert sglang.glibc == "2.34" and "cp311-cp311" in sglang.wheel_tags
    assert sglang.declared["sglang-kernel"] == "==0.4.10" and sglang.extras["flashinfer-python"] == ("cu13",)


def _record(**changes) -> dict:
    record = {"name": "sglang-0.5.23", "from": "sglang-0.5.9", "command": "builder bump sglang==0.5.23 --from sglang-0.5.9",
              "notes": ["flashinfer-python 0.7.2: no patch of its series is carried"],
              "bumped": [{"name": "sglang", "old": "0.5.9", "new": "0.5.23"}],
              "rows": [{"old": "sglang-0.5.9-cu128", "refused": "torch 2.14.1 on the default index is a CUDA 13.0 build",
                        "decisions": [], "candidate": "sglang-0.5.23-cu128", "old_pins": {}, "new_pins": {},
                        "compare_local": "sglang-0.5.9-cu128-local"},
                       {"old": "sglang-0.5.9-cu130", "refused": "", "decisions": ["removed sgl-kernel 0.3.21+cu130"],
                        "candidate": "sglang-0.5.23-cu130", "compare_local": "sglang-0.5.9-cu128-local",
                        "old_pins": {"sgl-kernel": {"version": "0.3.21+cu130", "source": "url"}},
                        "new_pins": {"sglang-kernel": {"version": "0.4.10", "source": "default index"}}}],
              "verdicts": [{"name": "0001-trtllm-comm-sm120.patch", "distribution": "flashinfer-python",
                            "old_version": "0.6.4", "new_version": "0.7.2", "wheel": "flashinfer_python-0.7.2.whl",
                            "wheel_sha256": "ab" * 32, "verdict": "dropped",
                            "evidence": ["    198:         supported_major_versions=[9, 10, 12]"]}],
              "overrides": [], "facts": {"torch==2.14.1": "pip's default index: torch-2.14.1-...; CUDA 13.0"},
              "compare_rows": ["sglang-0.5.9-cu128-local", "sglang-0.5.23-cu130-local"],
              "wheel_bytes": {"sglang-0.5.9-cu128-local": 5_240_000_000}}
    record.update(changes)
    return record


def _recorded_old_image(root: Path) -> None:
    """The old row's image as a build records it: a report with its layers and smoke summary."""
    reports = root / "build-reports"
    reports.mkdir()
    stack = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128-local")
    checks = SmokeReport("sha256:" + "1" * 64, stack.name,
                         tuple(Result(f"imports.m{i}", "pass" if i < 28 else "skip", "") for i in range(44)))
    build_report(stack.name, checks.image, layer_sizes=(5_000_000_000, 6_550_000_000), smoke=checks).write(
        reports / "old.json")
    base = LockedBase(stack.base.name, stack.base.image, True)
    records.record_build(stack.name, ImageRecord("sha256:" + "1" * 64, "sglang:old", ("sglang:old",), "f" * 64, base,
                                                 stack.source_date_epoch, "build-reports/old.json", "p.json"),
                         checks, root / "matrix.lock")


def test_report_lists_versions_rows_pins_verdicts_decisions_and_both_images(tmp_path):
    for name in ("matrix.toml", "matrix.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    before_cuda13(tmp_path)  # the candidate as the bump wrote it: not built yet
    _recorded_old_image(tmp_path)
    text = bump_report.markdown(_record(), tmp_path, tmp_path / "matrix.lock")
    assert text.startswith("# Bump: sglang-0.5.9 -> sglang-0.5.23\n")
    assert "| `sglang` | 0.5.9 | 0.5.23 |" in text
    assert "- **sglang-0.5.9-cu128: refused.** torch 2.14.1 on the default index is a CUDA 13.0 build" in text
    assert "| `sgl-kernel` | 0.3.21+cu130 | (removed) | url |" in text
    assert "| `sglang-kernel` |  | 0.4.10 | default index |" in text
    assert "`0001-trtllm-comm-sm120.patch`: **dropped**" in text and "supported_major_versions=[9, 10, 12]" in text
    assert "- sglang-0.5.9-cu130: removed sgl-kernel 0.3.21+cu130" in text
    assert "- `torch==2.14.1`: pip's default index" in text
    assert "| `sglang-0.5.9-cu128-local` | 5.24 GB | 11.55 GB | passed (28 pass, 0 fail, 16 skip) |" in text
    assert "| `sglang-0.5.23-cu130-local` | unknown | not built | not run |" in text
    assert "never known-good by being bumped" in text


def test_bump_workflow_bumps_when_newer_builds_default_index_rows_and_proposes_one_pull_request():
    workflow = yaml.safe_load((REPO / ".github/workflows/bump.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert "workflow_dispatch" in triggers and triggers["schedule"][0]["cron"]
    steps = workflow["jobs"]["candidate"]["steps"]
    runs = [step.get("run", "") for step in steps]

    def at(command: str) -> int:
        found = [i for i, run in enumerate(runs) if command in run]
        assert len(found) == 1, command
        return found[0]

    order = [at("builder bump --newer sglang"), at('builder bump "$PIN" --from "$FROM"'),
             at("builder render --check"), at("builder lock --check"), at("builder base"),
             at('builder build --stack "$row"'), at('builder bump --report "$CANDIDATE"')]
    assert order == sorted(order)
    for index in order[1:]:
        assert steps[index]["if"] in ("steps.newer.outputs.pin != ''", "steps.bump.outputs.default_index_rows != ''")
    upload = steps[-1]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["with"]["name"] == "bump-candidate"
    assert {"matrix.toml", "matrix.lock", "images/", "patches/"} <= set(upload["with"]["path"].split())
    # The pull request comes from the second job, which has the artifact and write access, and runs no builder.
    propose = workflow["jobs"]["propose"]
    assert propose["needs"] == "candidate" and propose["if"] == "needs.candidate.outputs.candidate != ''"
    assert propose["steps"][1]["with"]["name"] == "bump-candidate"
    (pull_request,) = [step["run"] for step in propose["steps"] if "gh pr create" in step.get("run", "")]
    assert "gh pr edit" in pull_request and "--body-file" in pull_request
    assert "git add matrix.toml matrix.lock images/ patches/" in pull_request
    assert not any(tool in pull_request for tool in (".venv/", "scripts/", "python", "sudo"))


def _clone(tmp_path: Path) -> Path:
    """A clone of the repository with the working tree's tracked files over it, so the code under test
    is the code being edited, not only what was committed."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, clone / name)
    return before_cuda13(clone)


def _cli(clone: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True,
                          cwd=clone, env=env)


@pytest.mark.network
def test_near_bump_writes_a_candidate_beside_the_old_stack_locked_rendered_and_checked(tmp_path, monkeypatch):
    """sglang 0.5.10 in a clone: the CUDA 13 row is refused (sglang-kernel 0.4.1 is a CUDA 12 build),
    the CUDA 12.8 row is written, every patch carried; render --check, lock --check and patches check
    pass, and the committed stacks and their lock entries are as they were."""
    import os

    from builder.config.matrix import load_matrix
    from builder.lock import store

    clone = _clone(tmp_path)
    facts = tmp_path / "facts.toml"
    env = {**os.environ, "BUILDER_COMPAT_FACTS": str(facts)}
    before_rows = load_matrix(clone / "matrix.toml").all_rows()
    before_lock = store.read(clone / "matrix.lock")

    result = _cli(clone, "bump", "sglang==0.5.10", "--from", "sglang-0.5.9", env=env)
    assert result.returncode == 0, result.stderr
    assert "wrote sglang-0.5.10 into matrix.toml after sglang-0.5.9" in result.stdout
    assert "sglang-0.5.10-cu128-local: resolved" in result.stdout
    report = (clone / "build-reports/bump-sglang-0.5.10.md").read_text()
    assert report in result.stdout
    assert "- **sglang-0.5.9-cu130: refused.** sglang-kernel 0.4.1 on the default index is a CUDA 12 build" in report
    renamed = [line for line in report.splitlines() if "sgl-kernel -> sglang-kernel is a rename: both wheels install" in line]
    assert len(renamed) == 1 and "sgl_kernel/" in renamed[0] and "lib/" not in renamed[0]
    assert report.count("**carried**") == 3
    assert re.search(r"\| `sglang-0.5.10-cu128-local` \| \d+\.\d\d GB \| not built \| not run \|", report)

    monkeypatch.setenv("BUILDER_COMPAT_FACTS", str(facts))  # for this test only: the rest of the session reads the real facts
    after = load_matrix(clone / "matrix.toml")
    assert [row for row in after.all_rows() if row.family == "sglang-0.5.9"] == list(before_rows)
    candidate = after.stack("sglang-0.5.10-cu128")
    assert candidate.package("sglang-kernel").version == "0.4.1" and candidate.package("sgl-kernel") is None
    assert candidate.replaces == "sglang-0.5.9-cu128" and candidate.patched == ("sglang", "flashinfer-python")
    assert not candidate.overrides  # 0.5.10's own flashinfer pin holds: nothing is contradicted
    lock = store.read(clone / "matrix.lock")
    assert {name: lock.get(name) for name in before_lock.stacks} == before_lock.stacks
    assert lock.get("sglang-0.5.10-cu128-local").outcome.status == "resolved"  # never known-good by bumping

    for command in (["render", "--check"], ["lock", "--check"], ["patches", "check"]):
        checked = _cli(clone, *command, env=env)
        assert checked.returncode == 0, (command, checked.stdout, checked.stderr)
    again = _cli(clone, "bump", "sglang==0.5.10", "--from", "sglang-0.5.9", env=env)
    assert again.returncode == 2 and "already taken" in again.stderr


@pytest.mark.network
def test_far_bump_refuses_the_cuda_12_8_row_and_writes_the_cuda_13_one_with_its_patches_marked(tmp_path, monkeypatch):
    """sglang 0.5.23: torch 2.14.1's default-index build is CUDA 13.0, so the 12.8 row goes; the 13.0 row
    takes every wheel from the default index; no patch is carried, and the matrix says which and why."""
    import os

    from builder.config.matrix import load_matrix

    clone = _clone(tmp_path)
    facts = tmp_path / "facts.toml"
    env = {**os.environ, "BUILDER_COMPAT_FACTS": str(facts)}
    result = _cli(clone, "bump", "sglang==0.5.23", "--from", "sglang-0.5.9", "--no-lock", env=env)
    assert result.returncode == 0, result.stderr
    report = (clone / "build-reports/bump-sglang-0.5.23.md").read_text()
    assert "- **sglang-0.5.9-cu128: refused.** torch 2.14.1 on the default index is a CUDA 13.0 build" in report
    assert "| `torch` | 2.9.1+cu130 | 2.14.1 | default index |" in report
    assert "sglang 0.5.23 asks for flashinfer-python[cu13]" in report
    assert report.count("**needs porting**") == 2 and report.count("**dropped**") == 1
    assert "serve modes baseline-fusion, eagle3-fusion give patches as their reason" in report
    matrix_text = (clone / "matrix.toml").read_text()
    assert "# NEEDS PORTING: sglang 0001-torch-symm-mem-sm120.patch" in matrix_text
    assert "# DROPPED: flashinfer-python 0001-trtllm-comm-sm120.patch" in matrix_text
    monkeypatch.setenv("BUILDER_COMPAT_FACTS", str(facts))  # for this test only: the rest of the session reads the real facts
    rows = [row for row in load_matrix(clone / "matrix.toml").all_rows() if row.family == "sglang-0.5.23"]
    assert [row.name for row in rows] == ["sglang-0.5.23-cu130", "sglang-0.5.23-cu130-local"]
    assert rows[0].patched == () and rows[0].replaces == "sglang-0.5.9-cu130"
    assert all(not (p.index or p.url) for p in rows[1].packages)  # the default-index row this host builds
    assert not (clone / "patches/sglang/0.5.23").exists()  # nothing carried, nothing pretends to apply


@pytest.mark.network
def test_a_pin_whose_default_index_build_misses_the_row_cuda_comes_from_the_rows_own_index(tmp_path):
    """torch 2.10.0 on the default index is not a CUDA 13 build, so the cu130 row takes 2.10.0+cu130 from
    its extra index (a PEP 503 page on loopback) and says why; with no such build there, the row is refused."""
    import dataclasses
    import functools
    import http.server
    import threading

    from builder.bump.candidate import Planner
    from builder.config.matrix import load_matrix

    (tmp_path / "torch").mkdir()
    page = '<a href="torch-2.10.0%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl#sha256={0}">' \
           "torch-2.10.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl</a>".format("0" * 64)
    (tmp_path / "torch" / "index.html").write_text(page)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index_url = f"http://127.0.0.1:{server.server_address[1]}/"
        row = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu130")
        row = dataclasses.replace(row, packages=tuple(
            dataclasses.replace(p, index=index_url) if p.name == "torch" else p for p in row.packages))
        plan = Planner({"torch": "2.10.0"}, Index(), {}).plan_row(row)
        assert not plan.refused
        assert (plan.packages["torch"].version, plan.packages["torch"].index) == ("2.10.0+cu130", index_url)
        assert any(d.startswith(f"torch 2.10.0+cu130 from {index_url}") and "on the default index is a CUDA 12"
                   in d for d in plan.decisions)
        (tmp_path / "torch" / "index.html").write_text("<html></html>")
        refused = Planner({"torch": "2.10.0"}, Index(), {}).plan_row(row)
        assert "torch 2.10.0 on the default index is a CUDA 12" in refused.refused
        assert f"{index_url} does not confirm a cu130 build (no such version there)" in refused.refused
    finally:
        server.shutdown()


@pytest.mark.network
def test_missing_wheel_facts_name_the_command_that_generates_them(tmp_path):
    """The matrix asks for `builder compat refresh` where it once asked for hand-typed facts, and after it
    runs the facts are there, with the wheel they came from."""
    import os

    for name in ("matrix.toml", "matrix.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    before_cuda13(tmp_path)  # its facts are the generated ones this test starts without
    text = (tmp_path / "matrix.toml").read_text().replace('sglang = { version = "0.5.9" }', 'sglang = { version = "0.5.8" }')
    (tmp_path / "matrix.toml").write_text(text)
    env = {**os.environ, "BUILDER_COMPAT_FACTS": str(tmp_path / "facts.toml")}
    before = _cli(tmp_path, "matrix", "--matrix", str(tmp_path / "matrix.toml"), env=env)
    assert before.returncode == 2
    assert "no wheel-tag facts for sglang 0.5.8: run `builder compat refresh sglang==0.5.8`" in before.stderr
    refresh = _cli(tmp_path, "compat", "refresh", "sglang==0.5.8", env=env)
    assert refresh.returncode == 0, refresh.stderr
    assert "sglang==0.5.8: tags py3-none" in refresh.stdout and "sglang-0.5.8-py3-none-any.whl (sha256 " in refresh.stdout
    after = _cli(tmp_path, "matrix", "--matrix", str(tmp_path / "matrix.toml"), env=env)
    assert "wheel-tag facts" not in after.stderr
    assert "patch series is written for 0.5.9, but the stack pins 0.5.8" in after.stderr  # the other rules still hold


@pytest.mark.network
def test_newer_names_the_release_beyond_every_stack_and_nothing_once_a_stack_pins_it(project):
    from packaging.version import Version

    from builder.bump.newer import newest_beyond_stacks
    from builder.config.matrix import load_matrix

    newest, family = newest_beyond_stacks(load_matrix(project / "matrix.toml"), "sglang")
    assert Version(newest) >= Version("0.5.23") and family == "sglang-0.5.9"
    result = _bump(project, "--newer", "sglang")
    assert (result.returncode, result.stdout) == (0, f"pin=sglang=={newest}\nfrom=sglang-0.5.9\n")
    import dataclasses
    import types

    rows = load_matrix(project / "matrix.toml").registry_stacks
    caught_up = tuple(dataclasses.replace(row, packages=tuple(
        dataclasses.replace(p, version=newest) if p.name == "sglang" else p for p in row.packages)) for row in rows)
    assert newest_beyond_stacks(types.SimpleNamespace(registry_stacks=caught_up), "sglang") is None
    refused = _bump(project, "--newer", "no-such-distribution-for-builder-tests")
    assert refused.returncode == 2 and "no stack pins no-such-distribution-for-builder-tests" in refused.stderr
