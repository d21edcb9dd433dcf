"""The patch series against the real upstream wheels (downloaded once, cached).

sglang 0.5.9 and flashinfer-python 0.6.4 are the versions the series are for;
sglang 0.5.10 is a real neighbouring release the 0.5.9 series does not fit.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.patches import patch_series
from builder.runtime import apply_patch
pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parent.parent
COMMUNICATOR_HUNK_2 = "sglang/srt/layers/communicator.py: hunk #2 (@@ -92,7 +94,7 @@)"
CORRUPT = ("         and _is_flashinfer_available\n", "         and _is_flashinfer_ready\n")


def copy_series(tmp_path: Path, dist: str, version: str, as_version: str | None = None) -> Path:
    root = tmp_path / "patches"
    shutil.copytree(patch_series.series_dir(dist, version, REPO / "patches"), root / dist / (as_version or version))
    return root


@pytest.mark.parametrize(
    ("dist", "version", "patched"),
    [
        ("sglang", "0.5.9", 3),
        ("flashinfer-python", "0.6.4", 1),
    ],
)
def test_series_applies_strictly_and_compiles(dist, version, patched):
    check = patch_series.check_series(dist, version, root=REPO / "patches")
    assert check.ok, patch_series.format_check(check)
    assert check.wheel.startswith(f"{dist.replace('-', '_')}-{version}-")
    assert all(r.offsets == () for r in check.results), "patches were made against these very files"
    assert sum(len(r.compiled) for r in check.results) == patched


def test_image_step_on_a_pip_installed_site_packages(tmp_path: Path):
    """What a patch layer does: pip installed the wheels (and their .pyc), then one RUN per patch."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    wheels = [patch_series.fetch_wheel("sglang", "0.5.9"), patch_series.fetch_wheel("flashinfer-python", "0.6.4")]
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
         *map(str, wheels)],
        check=True,
    )  # fmt: skip
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    site = Path(purelib)
    series = (patch_series.series_for("sglang", "0.5.9", REPO / "patches")
              + patch_series.series_for("flashinfer-python", "0.6.4", REPO / "patches"))
    for patch in series:
        result = subprocess.run(
            [str(python), "-I", str(REPO / "builder/runtime/apply_patch.py"), "--site-packages", str(site),
             str(patch.path)],
            capture_output=True, text=True, env={"SOURCE_DATE_EPOCH": "1767225600", "PATH": "/usr/bin:/bin"},
            check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"apply_patch: applied {patch.name}: ")
    for rel in (file for patch in series for file in patch.files):
        source = site / rel
        cached = sorted((source.parent / "__pycache__").glob(source.stem + ".*.pyc"))
        assert [c.name for c in cached] == [f"{source.stem}.{sys.implementation.cache_tag}.pyc"], rel
        pyc = cached[0].read_bytes()
        assert int.from_bytes(pyc[4:8], "little") == 0b11, f"{rel}: not a checked-hash .pyc"
        assert pyc[8:16] == importlib.util.source_hash(source.read_bytes()), f"{rel}: .pyc is stale"
    assert not [p for p in site.rglob("*") if p.suffix in (".orig", ".rej")]


def test_cli_check_reports_every_patch():
    result = subprocess.run(
        [sys.executable, "-m", "builder.cli", "patches", "check"],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    applied = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("  applied ")]
    assert applied == [
        "0001-trtllm-comm-sm120.patch",
        "0001-torch-symm-mem-sm120.patch",  # sglang 0.5.23
        "0002-allreduce-fusion-backend-sm120.patch",
        "0001-torch-symm-mem-sm120.patch",  # sglang 0.5.9
        "0002-allreduce-fusion-apply-sm120.patch",
    ]


def test_cli_check_of_a_stack_row_checks_its_series():
    result = subprocess.run(
        [sys.executable, "-m", "builder.cli", "patches", "check", "--stack", "sglang-0.5.9-cu130", "--stack", "sglang-0.5.9-cu128"],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    series = [line.split(":")[0] for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert series == ["sglang 0.5.9", "flashinfer-python 0.6.4"]


def corrupted_series(tmp_path: Path, as_version: str | None = None) -> Path:
    """The series with one context line of the communicator patch's hunk 2 changed."""
    root = copy_series(tmp_path, "sglang", "0.5.9", as_version)
    target = root / "sglang" / (as_version or "0.5.9") / "0002-allreduce-fusion-apply-sm120.patch"
    text = target.read_text()
    assert CORRUPT[0] in text
    target.write_text(text.replace(*CORRUPT, 1))
    return root


def test_corrupted_patch_is_refused_naming_the_hunk(tmp_path: Path):
    check = patch_series.check_series("sglang", "0.5.9", root=corrupted_series(tmp_path))
    by_name = {r.patch.name: r for r in check.results}
    assert not check.ok
    assert by_name["0002-allreduce-fusion-apply-sm120.patch"].problems == (f"{COMMUNICATOR_HUNK_2} FAILED at line 94",)
    assert by_name["0001-torch-symm-mem-sm120.patch"].ok


def test_patch_that_does_not_fit_is_refused_in_the_image_step(tmp_path: Path):
    site = patch_series.unpack(patch_series.fetch_wheel("sglang", "0.5.9"), tmp_path / "site-packages")
    before = (site / "sglang/srt/layers/communicator.py").read_bytes()
    patch = corrupted_series(tmp_path) / "sglang" / "0.5.9" / "0002-allreduce-fusion-apply-sm120.patch"
    result = subprocess.run(
        [sys.executable, "-I", str(REPO / "builder/runtime/apply_patch.py"), "--site-packages", str(site), str(patch)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"apply_patch: error: patch 0002-allreduce-fusion-apply-sm120.patch: {COMMUNICATOR_HUNK_2} FAILED at line 94"
    )
    assert (site / "sglang/srt/layers/communicator.py").read_bytes() == before
    assert not list(site.rglob("*.rej")) and not list(site.rglob("*.orig"))


def test_refresh_to_a_real_newer_release(tmp_path: Path):
    root = copy_series(tmp_path, "sglang", "0.5.9")
    outcomes = {o.name: o for o in patch_series.refresh_series("sglang", "0.5.9", "0.5.10", root=root)}

    assert outcomes["0001-torch-symm-mem-sm120.patch"] == patch_series.Refreshed("0001-torch-symm-mem-sm120.patch", True, ())
    offsets = outcomes["0002-allreduce-fusion-apply-sm120.patch"]
    assert offsets.ok and offsets.detail == (
        "sglang/srt/layers/communicator.py: hunk #1 (@@ -65,12 +65,14 @@) offset +4 lines",
        "sglang/srt/layers/communicator.py: hunk #2 (@@ -92,7 +94,7 @@) offset +5 lines",
    )
    new_dir = root / "sglang" / "0.5.10"
    old_dir = root / "sglang" / "0.5.9"
    assert sorted(p.name for p in new_dir.iterdir()) == [
        "0001-torch-symm-mem-sm120.patch",
        "0002-allreduce-fusion-apply-sm120.patch",
        "series",
    ]
    assert (new_dir / "0001-torch-symm-mem-sm120.patch").read_text() == (old_dir / "0001-torch-symm-mem-sm120.patch").read_text()
    regenerated = (new_dir / "0002-allreduce-fusion-apply-sm120.patch").read_text()
    assert regenerated.startswith(patch_series.patch_header(old_dir / "0002-allreduce-fusion-apply-sm120.patch"))
    assert "@@ -69,12 +69,14 @@" in regenerated and "@@ -97,7 +99,7 @@" in regenerated

    # The regenerated patches apply to 0.5.10 with no offset at all.
    site = patch_series.unpack(patch_series.fetch_wheel("sglang", "0.5.10"), tmp_path / "site-packages")
    for name in ("0001-torch-symm-mem-sm120.patch", "0002-allreduce-fusion-apply-sm120.patch"):
        assert apply_patch.apply(str(site), str(new_dir / name)).offsets == ()


def test_refresh_lists_a_patch_that_needs_a_person(tmp_path: Path):
    root = corrupted_series(tmp_path)
    outcomes = {o.name: o for o in patch_series.refresh_series("sglang", "0.5.9", "0.5.10", root=root)}
    person = outcomes["0002-allreduce-fusion-apply-sm120.patch"]
    assert not person.ok and person.detail[-1].startswith(f"{COMMUNICATOR_HUNK_2} FAILED at line")
    assert sorted(p.name for p in (root / "sglang" / "0.5.10").iterdir()) == ["0001-torch-symm-mem-sm120.patch", "series"]
