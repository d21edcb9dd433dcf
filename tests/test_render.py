"""Rendering: golden files, determinism, --check, hadolint on every rendered Dockerfile."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.cli.main import main
from builder.config.matrix import load_matrix
from builder.render import render
from builder.runtime import stackinfo
REPO = Path(__file__).resolve().parent.parent
MATRIX = load_matrix(REPO / "matrix.toml")


def rendered() -> dict[str, str]:
    return render.render_all(MATRIX.all_rows(), MATRIX.project)


def test_committed_images_match_rendering():
    """The golden files are the committed images/: any template or matrix change shows as a diff."""
    assert render.stale(rendered(), MATRIX.all_rows(), REPO) == []


RENDER_DIGEST = """
import hashlib, json, sys
from builder.config.matrix import load_matrix
from builder.render import render
from builder.runtime import stackinfo
matrix = load_matrix(sys.argv[1])
files = render.render_all(matrix.all_rows(), matrix.project)
print(hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest())
"""


def test_rendering_is_byte_identical_across_processes_and_hash_seeds():
    """Set and dict order, the one thing that varies between interpreters, must not reach a render."""
    digests = {
        subprocess.run([sys.executable, "-c", RENDER_DIGEST, str(REPO / "matrix.toml")], capture_output=True,
                       text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2", "3")
    }
    assert len(digests) == 1


def test_patch_layers_follow_their_package_and_precede_the_tools():
    dockerfile = rendered()["images/sglang-0.5.9-cu130/Dockerfile"]
    order = [dockerfile.index(marker) for marker in (
        "torch.plan.json", "kernels.plan.json", "sglang.plan.json", '"compile"',
        "0001-torch-symm-mem-sm120.patch", "0001-trtllm-comm-sm120.patch",
        "COPY builder/runtime/ /opt/builder/runtime/",
    )]
    assert order == sorted(order)
    assert dockerfile.count('"/opt/builder/apply_patch.py", "--site-packages"') == 3


def test_labels_record_pins_overrides_and_patch_hashes():
    dockerfile = rendered()["images/sglang-0.5.9-cu130/Dockerfile"]
    assert 'org.opencontainers.image.created="2026-01-01T00:00:00Z"' in dockerfile
    assert '\\"torch\\":\\"2.9.1+cu130\\"' in dockerfile
    assert '\\"declared\\":\\"==0.6.3\\"' in dockerfile
    for patch in render.rendered_patches(MATRIX.stack("sglang-0.5.9-cu130"), MATRIX.project.patches):
        assert patch.sha256 in dockerfile


def test_local_base_variant_uses_local_image_and_its_python():
    dockerfile = rendered()["images/sglang-0.5.9-cu128-local/Dockerfile"]
    assert "\nFROM localhost/builder-base:debian-bookworm\n" in dockerfile
    assert "/opt/venv/lib/python3.11/site-packages" in dockerfile
    assert "apt-get" not in dockerfile


def test_stack_json_carries_serve_profiles():
    import json

    info = json.loads(rendered()["images/sglang-0.5.9-cu130/stack.json"])
    assert info["schema"] == 2 and info["target_arch"] == ["12.0"]
    assert info["replaces"] == "sglang-0.5.9-cu128"
    assert info["driver"] == {"cuda": "13.0.1", "minimum": "580.82.07", "source":
                              "NVIDIA CUDA Toolkit release notes: CUDA 13.0 Update 1 needs >=580.82.07"}
    modes = info["serve"]["modes"]
    assert modes["baseline"]["args"]["attention_backend"] == "flashinfer"
    # Figures come from bench/reference.toml, the one place they are written, with their provenance.
    # No figure is recorded for CUDA 13 baseline with flashinfer: only the replaced row's 89.5.
    assert modes["baseline"]["reference"]["own"] is None
    assert modes["baseline"]["reference"]["replaced"] == {
        "stack": "sglang-0.5.9-cu128", "mode": "baseline", "tok_s": 89.5, "attention_backend": "likely flashinfer",
        "model": "not recorded: Kimi K2.5 INT4 or GLM-5 NVFP4 (the notes name both in different places), TP 8",
        "hardware": "8x NVIDIA RTX PRO 6000 Blackwell, PCIe Gen5, no NVLink", "source": "deployment notes",
        "note": "the previous stack's baseline, before the CUDA 13 upgrade; the notes call its backend \"likely\" flashinfer"}
    assert modes["eagle3"]["reference"]["own"]["tok_s"] == 96.1
    assert modes["eagle3"]["reference"]["replaced"]["tok_s"] == 54.1
    # The fused paths are switches in the profile, each with its reason.
    assert modes["baseline"]["args"].get("enable_flashinfer_allreduce_fusion") is None
    assert modes["eagle3-fusion"]["args"]["enable_flashinfer_allreduce_fusion"] is True
    assert modes["eagle3-fusion"]["args"]["enable_torch_symm_mem"] is True
    assert set(modes["baseline-fusion"]["reasons"]) == {
        "disable_custom_all_reduce", "enable_flashinfer_allreduce_fusion", "enable_torch_symm_mem"}
    previous = json.loads(rendered()["images/sglang-0.5.9-cu128-local/stack.json"])
    assert previous["replaces"] is None and previous["driver"]["minimum"] == "570.124.06"
    assert previous["serve"]["modes"]["eagle3"]["reference"] == {
        "own": modes["eagle3"]["reference"]["replaced"], "replaced": None}
    assert previous["serve"]["modes"]["baseline"]["reference"]["own"]["tok_s"] == 89.5
    local = json.loads(rendered()["images/sglang-0.5.9-cu130-local/stack.json"])
    assert local["replaces"] == "sglang-0.5.9-cu128-local"
    assert local["serve"]["modes"]["baseline"]["reference"] == modes["baseline"]["reference"]
    assert info["distributions"]["torch"] == "2.9.1+cu130"
    assert [p["name"] for p in info["patches"]][0] == "0001-torch-symm-mem-sm120.patch"


def test_stack_json_patch_records_keep_the_contract_the_image_reads():
    """builder/runtime/stackinfo.py documents the keys of each patch record the in-image tools read."""
    import json

    info = json.loads(rendered()["images/sglang-0.5.9-cu128-local/stack.json"])
    documented = "{" + '"package", "version", "name", "sha256", "path", "files"' + "}"
    assert documented in stackinfo.__doc__
    for record in info["patches"]:
        assert sorted(record) == sorted(["package", "version", "name", "sha256", "path", "files"])
        assert record["path"] == f"/opt/builder/patches/{record['package']}/{record['version']}/{record['name']}"


@pytest.mark.parametrize("dockerfile", sorted((REPO / "images").glob("*/Dockerfile")), ids=lambda p: p.parent.name)
def test_hadolint_clean(dockerfile):
    result = subprocess.run(["hadolint", "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_lists_stale_files(tmp_path, capsys, monkeypatch):
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "images", copy / "images")
    target = copy / "images/sglang-0.5.9-cu130/Dockerfile"
    target.write_text(target.read_text() + "# hand edit\n")
    (copy / "images/sglang-0.5.9-cu130/extra.txt").write_text("x")
    problems = render.stale(rendered(), MATRIX.all_rows(), copy)
    assert problems == ["images/sglang-0.5.9-cu130/Dockerfile (differs)",
                        "images/sglang-0.5.9-cu130/extra.txt (not rendered by any stack)"]


def project_copy(destination: Path) -> Path:
    """The files a project is: its matrix, lock, templates, patches and reference figures (no renders)."""
    for name in ("matrix.toml", "matrix.lock"):
        shutil.copy(REPO / name, destination / name)
    for folder in ("templates", "patches"):
        shutil.copytree(REPO / folder, destination / folder)
    (destination / "bench").mkdir()
    shutil.copy(REPO / "bench/reference.toml", destination / "bench/reference.toml")
    return destination / "matrix.toml"


def test_check_command_exit_codes_and_the_project_comes_from_the_matrix(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["render", "--check"]) == 0
    matrix = project_copy(tmp_path)
    assert main(["render", "--check", "--matrix", str(matrix)]) == 1
    err = capsys.readouterr().err
    assert "stale: images/sglang-0.5.9-cu130/Dockerfile (missing)" in err
    assert "rendered file(s) are stale; run `builder render`" in err
    assert main(["render", "--matrix", str(matrix)]) == 0
    assert not (REPO / "images").samefile(tmp_path / "images")
    assert (tmp_path / "images/sglang-0.5.9-cu130/Dockerfile").read_text() == \
        (REPO / "images/sglang-0.5.9-cu130/Dockerfile").read_text()


def test_render_writes_only_changes(tmp_path):
    files = rendered()
    assert sorted(render.write(files, tmp_path)) == sorted(files)
    assert render.write(files, tmp_path) == []
