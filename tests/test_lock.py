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
from builder.config.matrix import load_matrix
from builder.engine.identity import EngineIdentity
from builder.errors import BuildFailure, UserError
from builder.lock import records, store
from builder.lock.model import ImageRecord, LockedBase, PinnedRecord, PushRecord, SmokeRecord
from builder.lock.resolution import check_current, lock_stacks, record_base, requirements
from lock_values import (IMAGE, OTHER_IMAGE, base_digest_of, bench_report, dist, resolution_of, smoke_report,
                         system_packages_of)

REPO = Path(__file__).resolve().parent.parent
MATRIX = load_matrix(REPO / "matrix.toml")
CU128 = MATRIX.stack("sglang-0.5.9-cu128")
CU130 = MATRIX.stack("sglang-0.5.9-cu130")
LOCAL = MATRIX.stack("sglang-0.5.9-cu128-local")
@pytest.fixture
def path(tmp_path):
    return tmp_path / "matrix.lock"


def locked(path, stack=CU128, *extra):
    lock_stacks([stack], path=path, resolver=lambda s: resolution_of(s, *extra), base_resolver=base_digest_of,
                apt_resolver=system_packages_of,
                references=reference_figures.load(MATRIX.project.reference_figures, stacks=MATRIX.all_rows()))


# --- atomic writes and concurrent writers ----------------------------------------------------


def test_crash_mid_write_leaves_the_old_lock(path):
    locked(path, LOCAL)
    before = path.read_bytes()
    # A writer killed after writing its temporary file but before the rename.
    crash = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from builder.lock import store\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        "store.update(lambda lock: lock.stacks.clear(), path=sys.argv[1])\n"
    )
    result = subprocess.run([sys.executable, "-c", crash, str(path)], capture_output=True)
    assert result.returncode == -9
    assert path.read_bytes() == before
    leftovers = list(path.parent.glob(".matrix.lock.*.tmp"))
    assert len(leftovers) == 1 and json.loads(leftovers[0].read_text())["stacks"] == {}
    # The next writer clears what the dead one left.
    assert record_base("debian-bookworm", "sha256:" + "b" * 64, path=path) == [LOCAL.name]
    assert list(path.parent.glob(".matrix.lock.*.tmp")) == []
    assert entry(path, LOCAL).resolution.base.image_id == "sha256:" + "b" * 64


def test_a_failing_change_writes_nothing(path):
    locked(path)
    before = path.read_bytes()

    def change(lock):
        lock.stacks.clear()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.update(change, path=path)
    assert path.read_bytes() == before
    assert list(path.parent.glob(".matrix.lock.*.tmp")) == []


def _writer(path: str, writer: int, count: int) -> None:
    for number in range(count):
        def change(lock, number=number):
            time.sleep(0.002)  # widen the read-modify-write window
            found = lock.get(CU128.name)
            lock.stacks[f"writer-{writer}-{number}"] = dataclasses.replace(
                found, resolution=dataclasses.replace(found.resolution, stack=f"writer-{writer}-{number}"))
        store.update(change, path=Path(path))


def test_concurrent_writers_all_land(path):
    locked(path)
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_writer, args=(str(path), k, 20)) for k in range(4)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
        assert process.exitcode == 0
    stacks = store.read(path).stacks
    assert {f"writer-{k}-{n}" for k in range(4) for n in range(20)} <= set(stacks)
    assert CU128.name in stacks


def test_new_lock_gets_ordinary_permissions_and_keeps_them(path):
    locked(path, LOCAL)
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    path.chmod(0o640)
    assert record_base("debian-bookworm", "sha256:" + "c" * 64, path=path) == [LOCAL.name]
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
    path.write_text('{"schema": 2, "stacks": {')
    with pytest.raises(UserError, match=r"matrix.lock:1: not valid JSON"):
        store.read(path)
    path.write_text('{"schema": 7, "stacks": {}}')
    with pytest.raises(UserError, match=r"unsupported lock schema 7 \(this builder reads 1 and 2\)$"):
        store.read(path)
    path.write_text('{"schema": 2, "stacks": {"x": {"resolution": {}}}}')
    with pytest.raises(UserError, match=r"matrix.lock: not a schema-2 lock \(KeyError"):
        store.read(path)


# --- what a lock entry records -------------------------------------------------------------


def test_entry_records_base_epoch_hashes_overrides_and_references(path):
    locked(path)
    found = entry(path)
    assert found.outcome.status == "resolved"
    assert found.resolution.base == LockedBase("cuda-12.8.1", "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04", False,
                                               manifest_digest=base_digest_of("nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"))
    assert found.resolution.source_date_epoch == 1767225600
    assert found.resolution.distribution("flashinfer-python").version == "0.6.4"
    assert found.resolution.distribution("flashinfer-python").group == "kernels"
    assert {o.package: o.version for o in found.resolution.overrides} == {"flashinfer-python": "0.6.4",
                                                                          "flashinfer-cubin": "0.6.4"}
    reference = found.outcome.bench.reference
    assert [(f["mode"], f["tok_s"]) for f in reference] == [("baseline", 89.5), ("eagle3", 54.1)]
    assert reference[0]["hardware"]["gpus"] == 8


def test_requirements_for_renders_groups_pinned_to_the_locked_files(path):
    """One hash per distribution, the locked file's, and no index or URL: the build installs with
    --no-index from a directory holding exactly those files (builder/cache/wheel_cache.py)."""
    extra = dist("filelock", "3.20.0", "torch", hashes=("a" * 64, "b" * 64))
    locked(path, CU130, extra)
    texts = requirements(check_current(CU130, path).resolution)
    assert list(texts) == ["torch", "kernels", "sglang"]
    torch_text = texts["torch"]
    assert torch_text.startswith("# sglang-0.5.9-cu130, install group torch: generated from matrix.lock")
    chosen = ('filelock'.encode().hex() * 64)[:64]  # the file the lock chose (lock_values.dist)
    assert f"filelock==3.20.0 \\\n    --hash=sha256:{chosen}\n" in torch_text
    assert 'a' * 64 not in torch_text and 'b' * 64 not in torch_text
    assert torch_text.index("filelock==") < torch_text.index("torch==2.9.1+cu130")
    assert "sgl-kernel==0.3.21+cu130 \\\n    --hash=sha256:" in texts["kernels"]
    for text in texts.values():
        assert "--extra-index-url" not in text and "@" not in text and "://" not in text
    assert "sglang==0.5.9 \\\n" in texts["sglang"]


def test_unlocked_and_stale_stacks_are_refused(path):
    with pytest.raises(UserError, match=r"^sglang-0.5.9-cu128 is not in matrix.lock: run `builder lock"):
        check_current(CU128, path)
    locked(path)
    assert check_current(CU128, path).name == CU128.name
    moved = dataclasses.replace(CU128, packages=tuple(
        dataclasses.replace(p, version="0.5.10") if p.name == "sglang" else p for p in CU128.packages))
    with pytest.raises(UserError, match=r"^sglang-0.5.9-cu128: matrix.lock was resolved from other pins"):
        check_current(moved, path)


# --- the status lifecycle ------------------------------------------------------------------


def entry(path, stack=CU128):
    return store.entry(stack.name, path)


def image_record(image=IMAGE, inputs_hash="f" * 64):
    return ImageRecord(
        image_id=image, immutable_tag="sglang:0.5.9-cu128-abc", tags=("sglang:0.5.9-cu128-abc", "sglang:0.5.9-cu128"),
        inputs_hash=inputs_hash, base=LockedBase("cuda-12.8.1", "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04", False),
        source_date_epoch=CU128.source_date_epoch, report="build-reports/sglang-0.5.9-cu128.json",
        provenance="build-reports/sglang-0.5.9-cu128.provenance.json", sbom="build-reports/sglang-0.5.9-cu128.cdx.json")


def built(path, image=IMAGE):
    """A build that passed its smoke checks: `builder build` records nothing else."""
    records.record_build(CU128.name, image_record(image), smoke_report(image=image), path=path)


def test_build_records_its_whole_outcome_in_one_write_then_pin(path, monkeypatch):
    locked(path)
    writes = []
    real_write = store.write_atomic
    monkeypatch.setattr(store, "write_atomic", lambda *a: (writes.append(a[0]), real_write(*a)))
    built(path)
    assert writes == [path]
    outcome = entry(path).outcome
    assert outcome.status == "smoke-passed"
    assert outcome.smoke == SmokeRecord(IMAGE, True, smoke_report())
    assert outcome.image == image_record()
    references = reference_figures.load(MATRIX.project.reference_figures, stacks=MATRIX.all_rows())[CU128.name]
    pinned = records.pin(CU128.name, references, path)
    assert pinned.outcome.status == "pinned" == entry(path).outcome.status
    assert entry(path).outcome.pinned == PinnedRecord(IMAGE, None)


def test_the_engine_that_made_the_image_is_recorded_with_its_id(path):
    locked(path)
    built(path)
    assert entry(path).outcome.image.engine is None  # a build that did not say: nothing invented
    identity = EngineIdentity("buildah", "1.39.3")
    records.record_build(CU128.name, dataclasses.replace(image_record(), engine=identity), smoke_report(), path=path)
    assert entry(path).outcome.image.engine == identity
    assert json.loads(path.read_text())["stacks"][CU128.name]["outcome"]["image"]["engine"] == {
        "name": "buildah", "version": "1.39.3"}


def test_pin_refuses_an_image_that_has_not_passed_smoke(path):
    locked(path)
    with pytest.raises(UserError, match="^sglang-0.5.9-cu128 cannot be pinned: no image was built"):
        records.pin(CU128.name, [], path)
    built(path)
    before = path.read_bytes()
    records.record_smoke(CU128.name, smoke_report(False), path=path)
    with pytest.raises(UserError, match=rf"^sglang-0.5.9-cu128 cannot be pinned: its image {IMAGE} has not "
                                        r"passed smoke \(status built\)$"):
        records.pin(CU128.name, [], path)
    assert entry(path).outcome.status == "built"
    assert before != path.read_bytes()  # the failed smoke was recorded


def test_a_failed_candidate_does_not_touch_the_recorded_image(path):
    locked(path)
    built(path)
    records.pin(CU128.name, [], path)
    records.record_smoke(CU128.name, smoke_report(False, image=OTHER_IMAGE), image_id=OTHER_IMAGE, path=path)
    outcome = entry(path).outcome
    assert outcome.status == "pinned"
    assert outcome.rejected_candidate == SmokeRecord(OTHER_IMAGE, False, smoke_report(False, image=OTHER_IMAGE))


def _pushed_measured_and_pinned(path):
    locked(path)
    built(path)
    records.record_bench(CU128.name, bench_report(), "bench.json", path=path)
    records.record_push(CU128.name, PushRecord("127.0.0.1:5000", "sglang", "0.5.9-cu128-abc", "sha256:" + "d" * 64),
                        path=path)
    records.pin(CU128.name, [], path)


def test_a_new_image_clears_push_measurements_and_pin(path):
    _pushed_measured_and_pinned(path)
    built(path, OTHER_IMAGE)
    outcome = entry(path).outcome
    assert (outcome.status, outcome.push, outcome.bench.measured) == ("smoke-passed", None, ())
    assert outcome.smoke.image_id == OTHER_IMAGE and outcome.image.manifest_digest is None
    assert outcome.pinned is None


def test_rebuilding_the_recorded_image_keeps_what_was_learnt_about_it(path):
    _pushed_measured_and_pinned(path)
    before = entry(path)
    built(path)
    after = entry(path)
    assert after == before and after.outcome.status == "pinned"
    assert after.outcome.image.manifest_digest == after.outcome.push.manifest_digest == "sha256:" + "d" * 64


def test_relocking_the_same_distributions_on_the_same_base_keeps_the_image(path):
    locked(path)
    built(path)
    locked(path)
    assert entry(path).outcome.status == "smoke-passed"
    locked(path, CU128, dist("new-dependency", "1.0", "sglang"))
    outcome = entry(path).outcome
    assert (outcome.status, outcome.image) == ("resolved", None)


def test_a_registry_base_whose_tag_moved_starts_the_entry_over(path):
    locked(path)
    built(path)
    moved = "sha256:" + "e" * 64
    lock_stacks([CU128], path=path, resolver=resolution_of, base_resolver=lambda image: moved, apt_resolver=system_packages_of)
    found = entry(path)
    assert (found.outcome.status, found.outcome.image, found.resolution.base.manifest_digest) == ("resolved", None, moved)


def test_relocking_a_local_row_keeps_the_digest_builder_base_recorded(path):
    local = MATRIX.stack("sglang-0.5.9-cu128-local")
    asked = []
    lock_stacks([local], path=path, resolver=resolution_of, base_resolver=asked.append, apt_resolver=system_packages_of)
    assert entry(path, local).resolution.base.image_id is None
    assert record_base("debian-bookworm", "sha256:" + "e" * 64, path=path) == [local.name]
    lock_stacks([local], path=path, resolver=resolution_of, base_resolver=asked.append, apt_resolver=system_packages_of)
    assert entry(path, local).resolution.base.image_id == "sha256:" + "e" * 64
    assert asked == []  # the local base is in no registry


def test_bench_regression_is_recorded_and_refuses_the_pin(path, tmp_path):
    locked(path)
    built(path)
    report = tmp_path / "bench-eagle3.json"
    report.write_text(json.dumps(bench_report(tok_s=40.0, verdict="regression")))
    with pytest.raises(BuildFailure, match="^sglang-0.5.9-cu128 cannot be pinned: bench regression in eagle3$"):
        records.pin_stack(CU128.name, [], [report], path=path)
    measured = entry(path).outcome.bench.measured
    assert [(f.mode, f.tok_s, f.hardware, f.model, f.image_id) for f in measured] == [
        ("eagle3", 40.0, "8x NVIDIA RTX PRO 6000 Blackwell", "/models/test", IMAGE)]
    assert entry(path).outcome.status == "smoke-passed"
    # A better measurement replaces it and the pin goes through.
    report.write_text(json.dumps(bench_report(tok_s=55.0)))
    assert records.pin_stack(CU128.name, [], [report], path=path).outcome.status == "pinned"
    assert [f.tok_s for f in entry(path).outcome.bench.measured] == [55.0]


def test_bench_report_for_another_stack_or_malformed_is_refused(path, tmp_path):
    locked(path)
    built(path)
    with pytest.raises(UserError, match="measured sglang-0.5.9-cu130, not sglang-0.5.9-cu128"):
        records.record_bench(CU128.name, bench_report(stack="sglang-0.5.9-cu130"), "b.json", path=path)
    with pytest.raises(UserError, match=r"^b.json: not a bench report \('gpus'\)"):
        records.record_bench(CU128.name, {"mode": "eagle3", "tok_s": 1.0}, "b.json", path=path)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(UserError, match="broken.json:1: not valid JSON"):
        records.pin_stack(CU128.name, [], [broken], path=path)


def test_records_for_a_stack_never_locked_say_how_to_lock_it(path):
    locked(path)
    with pytest.raises(UserError, match=r"^sglang-0.5.9-cu130 is not in matrix.lock: run `builder lock --stack sglang-0.5.9-cu130` first$"):
        records.record_build(CU130.name, image_record(), smoke_report(), path=path)
