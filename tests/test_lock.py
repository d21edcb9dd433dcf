"""matrix.lock: atomic writes, two writers, the status lifecycle, hashed requirements."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.config import reference_figures
from builder.publish import lock
from builder.errors import BuildFailure, UserError
from builder.config.matrix import load_matrix
from support import IMAGE, OTHER_IMAGE, base_digest_of, bench_report, dist, resolution_of, system_packages_of

REPO = Path(__file__).resolve().parent.parent
MATRIX = load_matrix(REPO / "matrix.toml")
CU128 = MATRIX.stack("sglang-0.5.9-cu128")
CU130 = MATRIX.stack("sglang-0.5.9-cu130")
@pytest.fixture
def path(tmp_path):
    return tmp_path / "matrix.lock"


def locked(path, stack=CU128, *extra):
    lock.lock_stacks([stack], path=path, resolver=lambda s: resolution_of(s, *extra), base_resolver=base_digest_of,
                     references=reference_figures.load(MATRIX.project.reference_figures, stacks=MATRIX.all_rows()), apt_resolver=system_packages_of)


# --- atomic writes and concurrent writers ----------------------------------------------------


def test_crash_mid_write_leaves_the_old_lock(path):
    locked(path)
    before = path.read_bytes()
    # A writer killed after writing its temporary file but before the rename.
    crash = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from builder.publish import lock\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        "lock.update(lambda data: data['stacks'].clear(), path=sys.argv[1])\n"
    )
    result = subprocess.run([sys.executable, "-c", crash, str(path)], capture_output=True)
    assert result.returncode == -9
    assert path.read_bytes() == before
    leftovers = list(path.parent.glob(".matrix.lock.*.tmp"))
    assert len(leftovers) == 1 and json.loads(leftovers[0].read_text())["stacks"] == {}
    # The next writer clears what the dead one left.
    assert lock.record_base("cuda-12.8.1", "sha256:" + "b" * 64, path=path) == [CU128.name]
    assert list(path.parent.glob(".matrix.lock.*.tmp")) == []
    assert lock.entry(CU128, path)["base"]["digest"] == "sha256:" + "b" * 64


def test_a_failing_change_writes_nothing(path):
    locked(path)
    before = path.read_bytes()

    def change(data):
        data["stacks"].clear()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        lock.update(change, path=path)
    assert path.read_bytes() == before
    assert list(path.parent.glob(".matrix.lock.*.tmp")) == []


def _writer(path: str, writer: int, count: int) -> None:
    for number in range(count):
        def change(data, number=number):
            time.sleep(0.002)  # widen the read-modify-write window
            data["stacks"][f"writer-{writer}-{number}"] = {"writer": writer, "number": number}
        lock.update(change, path=Path(path))


def test_concurrent_writers_all_land(path):
    locked(path)
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_writer, args=(str(path), k, 20)) for k in range(4)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
        assert process.exitcode == 0
    stacks = lock.read(path)["stacks"]
    assert {f"writer-{k}-{n}" for k in range(4) for n in range(20)} <= set(stacks)
    assert CU128.name in stacks


def test_new_lock_gets_ordinary_permissions_and_keeps_them(path):
    locked(path)
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    path.chmod(0o640)
    lock.record_base("cuda-12.8.1", "sha256:" + "c" * 64, path=path)
    assert path.stat().st_mode & 0o777 == 0o640


def _umask() -> int:
    import os

    current = os.umask(0)
    os.umask(current)
    return current


def test_output_is_deterministic_sorted_json(path, tmp_path):
    locked(path)
    other = tmp_path / "again" / "matrix.lock"
    locked(other)
    assert path.read_bytes() == other.read_bytes()
    text = path.read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_corrupt_lock_is_a_one_line_error(path):
    path.write_text('{"schema": 1, "stacks": {')
    with pytest.raises(UserError, match=r"matrix.lock:1: not valid JSON"):
        lock.read(path)
    path.write_text('{"schema": 7, "stacks": {}}')
    with pytest.raises(UserError, match="unsupported lock schema 7"):
        lock.read(path)


# --- what a lock entry records -------------------------------------------------------------


def test_entry_records_base_epoch_hashes_overrides_and_references(path):
    locked(path)
    entry = lock.entry(CU128, path)
    assert entry["status"] == "resolved"
    assert entry["base"] == {"name": "cuda-12.8.1", "image": "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04",
                             "digest": base_digest_of("nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"), "local": False}
    assert entry["source_date_epoch"] == 1767225600
    assert entry["distributions"]["flashinfer-python"]["version"] == "0.6.4"
    assert entry["distributions"]["flashinfer-python"]["group"] == "kernels"
    assert {o["package"]: o["version"] for o in entry["overrides"]} == {"flashinfer-python": "0.6.4",
                                                                         "flashinfer-cubin": "0.6.4"}
    assert [(f["mode"], f["tok_s"]) for f in entry["bench"]["reference"]] == [("baseline", 89.5), ("eagle3", 54.1)]
    assert entry["bench"]["reference"][0]["hardware"]["gpus"] == 8


def test_requirements_for_renders_groups_pinned_to_the_locked_files(path):
    """One hash per distribution, the locked file's, and no index or URL: the build installs with
    --no-index from a directory holding exactly those files (builder/image/wheel_cache.py)."""
    extra = dist("filelock", "3.20.0", "torch", hashes=("a" * 64, "b" * 64))
    locked(path, CU130, extra)
    texts = lock.requirements_for(CU130, path)
    assert list(texts) == ["torch", "kernels", "sglang"]
    torch_text = texts["torch"]
    assert torch_text.startswith("# sglang-0.5.9-cu130, install group torch: generated from matrix.lock")
    chosen = ('filelock'.encode().hex() * 64)[:64]  # the file the lock chose (support.dist)
    assert f"filelock==3.20.0 \\\n    --hash=sha256:{chosen}\n" in torch_text
    assert 'a' * 64 not in torch_text and 'b' * 64 not in torch_text
    assert torch_text.index("filelock==") < torch_text.index("torch==2.9.1+cu130")
    assert "sgl-kernel==0.3.21+cu130 \\\n    --hash=sha256:" in texts["kernels"]
    for text in texts.values():
        assert "--extra-index-url" not in text and "@" not in text and "://" not in text
    assert "sglang==0.5.9 \\\n" in texts["sglang"]


def test_requirements_for_unlocked_and_stale_stacks(path):
    assert lock.requirements_for("sglang-0.5.9-cu128", path) is None
    locked(path)
    assert lock.requirements_for("sglang-0.5.9-cu128", path) is not None
    moved = dataclasses.replace(CU128, packages=tuple(
        dataclasses.replace(p, version="0.5.10") if p.name == "sglang" else p for p in CU128.packages))
    with pytest.raises(UserError, match=r"^sglang-0.5.9-cu128: matrix.lock was resolved from other pins"):
        lock.requirements_for(moved, path)


# --- the status lifecycle ------------------------------------------------------------------


def image_record(image=IMAGE, inputs_hash="f" * 64):
    return lock.ImageRecord(
        image_id=image, tags=("sglang:0.5.9-cu128-abc", "sglang:0.5.9-cu128"), inputs_hash=inputs_hash,
        base_digest="", source_date_epoch=CU128.source_date_epoch, report="build-reports/sglang-0.5.9-cu128.json",
        provenance="build-reports/sglang-0.5.9-cu128.provenance.json", sbom="build-reports/sglang-0.5.9-cu128.cdx.json")


def built(path, image=IMAGE):
    """A build that passed its smoke checks: `builder build` records nothing else."""
    lock.record_build(CU128, image_record(image), {"passed": True, "checks": []}, path=path)


def test_build_records_its_whole_outcome_in_one_write_then_pin(path, monkeypatch):
    locked(path)
    writes = []
    real_write = lock.write_atomic
    monkeypatch.setattr(lock, "write_atomic", lambda *a: (writes.append(a[0]), real_write(*a)))
    built(path)
    assert writes == [path]
    entry = lock.entry(CU128, path)
    assert entry["status"] == "smoke-passed"
    assert entry["smoke"] == {"image_id": IMAGE, "passed": True, "report": {"passed": True, "checks": []}}
    assert entry["image"]["immutable_tag"] == "sglang:0.5.9-cu128-abc"
    assert entry["image"]["report"] == "build-reports/sglang-0.5.9-cu128.json"
    assert entry["image"]["provenance"] == "build-reports/sglang-0.5.9-cu128.provenance.json"
    assert (entry["image"]["inputs_hash"], entry["image"]["source_date_epoch"]) == ("f" * 64, 1767225600)
    references = reference_figures.load(MATRIX.project.reference_figures, stacks=MATRIX.all_rows())[CU128.name]
    pinned = lock.pin(CU128, references, path)
    assert pinned["status"] == "pinned" == lock.entry(CU128, path)["status"]
    assert lock.entry(CU128, path)["pinned"] == {"image_id": IMAGE, "digest": None}


def test_pin_refuses_an_image_that_has_not_passed_smoke(path):
    locked(path)
    with pytest.raises(UserError, match="^sglang-0.5.9-cu128 cannot be pinned: no image was built"):
        lock.pin(CU128, [], path)
    built(path)
    before = path.read_bytes()
    lock.record_smoke(CU128.name, passed=False, report={"passed": False}, path=path)
    with pytest.raises(UserError, match=rf"^sglang-0.5.9-cu128 cannot be pinned: its image {IMAGE} has not "
                                        r"passed smoke \(status built\)$"):
        lock.pin(CU128, [], path)
    assert lock.entry(CU128, path)["status"] == "built"
    assert before != path.read_bytes()  # the failed smoke was recorded


def test_a_failed_candidate_does_not_touch_the_recorded_image(path):
    locked(path)
    built(path)
    lock.pin(CU128, [], path)
    lock.record_smoke(CU128.name, passed=False, report={"passed": False}, image_id=OTHER_IMAGE, path=path)
    entry = lock.entry(CU128, path)
    assert entry["status"] == "pinned"
    assert entry["rejected_candidate"]["image_id"] == OTHER_IMAGE


def _pushed_measured_and_pinned(path):
    locked(path)
    built(path)
    lock.record_bench(CU128, bench_report(), "bench.json", path=path)
    lock.record_push(CU128.name, "127.0.0.1:5000", "sglang", "0.5.9-cu128-abc", "sha256:" + "d" * 64, path=path)
    lock.pin(CU128, [], path)


def test_a_new_image_clears_push_measurements_and_pin(path):
    _pushed_measured_and_pinned(path)
    built(path, OTHER_IMAGE)
    entry = lock.entry(CU128, path)
    assert (entry["status"], entry["push"], entry["bench"]["measured"]) == ("smoke-passed", None, [])
    assert entry["smoke"]["image_id"] == OTHER_IMAGE and entry["image"]["digest"] is None
    assert "pinned" not in entry


def test_rebuilding_the_recorded_image_keeps_what_was_learnt_about_it(path):
    _pushed_measured_and_pinned(path)
    before = lock.entry(CU128, path)
    built(path)
    after = lock.entry(CU128, path)
    assert after == before and after["status"] == "pinned" and after["image"]["digest"] == "sha256:" + "d" * 64


def test_relocking_the_same_distributions_on_the_same_base_keeps_the_image(path):
    locked(path)
    built(path)
    locked(path)
    assert lock.entry(CU128, path)["status"] == "smoke-passed"
    locked(path, CU128, dist("new-dependency", "1.0", "sglang"))
    entry = lock.entry(CU128, path)
    assert (entry["status"], entry["image"]) == ("resolved", None)


def test_a_registry_base_whose_tag_moved_starts_the_entry_over(path):
    locked(path)
    built(path)
    moved = "sha256:" + "e" * 64
    lock.lock_stacks([CU128], path=path, resolver=resolution_of, base_resolver=lambda image: moved, apt_resolver=system_packages_of)
    entry = lock.entry(CU128, path)
    assert (entry["status"], entry["image"], entry["base"]["digest"]) == ("resolved", None, moved)


def test_relocking_a_local_row_keeps_the_digest_builder_base_recorded(path):
    local = MATRIX.stack("sglang-0.5.9-cu128-local")
    asked = []
    lock.lock_stacks([local], path=path, resolver=resolution_of, base_resolver=asked.append, apt_resolver=system_packages_of)
    assert lock.entry(local, path)["base"]["digest"] == ""
    assert lock.record_base("debian-bookworm", "sha256:" + "e" * 64, path=path) == [local.name]
    lock.lock_stacks([local], path=path, resolver=resolution_of, base_resolver=asked.append, apt_resolver=system_packages_of)
    assert lock.entry(local, path)["base"]["digest"] == "sha256:" + "e" * 64
    assert asked == []  # the local base is in no registry


def test_bench_regression_is_recorded_and_refuses_the_pin(path, tmp_path):
    locked(path)
    built(path)
    report = tmp_path / "bench-eagle3.json"
    report.write_text(json.dumps(bench_report(tok_s=40.0, verdict="regression")))
    with pytest.raises(BuildFailure, match="^sglang-0.5.9-cu128 cannot be pinned: bench regression in eagle3$"):
        lock.pin_stack(CU128, [], [report], path=path)
    measured = lock.entry(CU128, path)["bench"]["measured"]
    assert [(f["mode"], f["tok_s"], f["hardware"], f["model"]) for f in measured] == [
        ("eagle3", 40.0, "8x NVIDIA RTX PRO 6000 Blackwell", "/models/test")]
    assert lock.entry(CU128, path)["status"] == "smoke-passed"
    # A better measurement replaces it and the pin goes through.
    report.write_text(json.dumps(bench_report(tok_s=55.0)))
    assert lock.pin_stack(CU128, [], [report], path=path)["status"] == "pinned"
    assert [f["tok_s"] for f in lock.entry(CU128, path)["bench"]["measured"]] == [55.0]


def test_bench_report_for_another_stack_or_malformed_is_refused(path, tmp_path):
    locked(path)
    built(path)
    with pytest.raises(UserError, match="measured sglang-0.5.9-cu130, not sglang-0.5.9-cu128"):
        lock.record_bench(CU128, bench_report(stack="sglang-0.5.9-cu130"), "b.json", path=path)
    with pytest.raises(UserError, match=r"^b.json: not a bench report \('gpus'\)"):
        lock.record_bench(CU128, {"mode": "eagle3", "tok_s": 1.0}, "b.json", path=path)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(UserError, match="broken.json:1: not valid JSON"):
        lock.pin_stack(CU128, [], [broken], path=path)


def test_records_for_a_stack_never_locked_say_how_to_lock_it(path):
    locked(path)
    with pytest.raises(UserError, match=r"^sglang-0.5.9-cu130 is not in matrix.lock: run `builder lock --stack sglang-0.5.9-cu130` first$"):
        lock.record_build(CU130, image_record(), {"passed": True}, path=path)
