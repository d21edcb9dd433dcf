"""`builder lock` and `builder pin` from the command line, and the reference figures they record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.config import reference_figures
from builder.image import render
from builder.publish import lock
from builder.cli.main import main
from builder.errors import UserError
from builder.config.matrix import load_matrix
from support import IMAGE, bench_report, link_project_files, resolution_of

REPO = Path(__file__).resolve().parent.parent
MATRIX_TEXT = (REPO / "matrix.toml").read_text()
MATRIX = load_matrix(REPO / "matrix.toml")
REFERENCE_TEXT = (REPO / "bench" / "reference.toml").read_text()


@pytest.fixture
def lock_path(tmp_path, monkeypatch):
    path = tmp_path / "matrix.lock"
    monkeypatch.setenv("BUILDER_LOCK", str(path))
    return path


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_lock_with_unreachable_sources_exits_2_and_writes_nothing(tmp_path, lock_path, capsys):
    """The cu130 row with its outside sources moved to a loopback port nothing listens on."""
    stack = MATRIX.stack("sglang-0.5.9-cu130")
    text, dead = MATRIX_TEXT, {}
    for name in ("torch", "flashinfer-jit-cache", "sgl-kernel"):
        package = stack.package(name)
        source = package.url or package.index
        dead[name] = "http://127.0.0.1:9/" + name + "/" + source.split("/", 3)[3]
        text = text.replace(source, dead[name])
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(text)
    link_project_files(tmp_path)
    status, out, err = run(capsys, "lock", "--matrix", str(matrix), "--stack", "sglang-0.5.9-cu130")
    assert status == 2
    assert err == (
        "builder: error: sglang-0.5.9-cu130: "
        f"cannot reach package index {dead['flashinfer-jit-cache']} (connection refused); "
        f"cannot reach wheel URL {dead['sgl-kernel']} (connection refused); "
        f"cannot reach package index {dead['torch']} (connection refused); nothing was locked\n"
    )
    assert not lock_path.exists()


def test_lock_of_an_unknown_stack_suggests_the_name(lock_path, capsys):
    status, _, err = run(capsys, "lock", "--stack", "sglang-0.5.9-cu12")
    assert status == 2
    assert err == "builder: error: unknown stack 'sglang-0.5.9-cu12' (did you mean 'sglang-0.5.9-cu128'?)\n"


def test_pin_refuses_a_stack_that_was_never_built(lock_path, capsys):
    lock_path.write_text(json.dumps({"schema": 1, "stacks": {}}))
    status, _, err = run(capsys, "pin", "sglang-0.5.9-cu128")
    assert status == 2
    assert err == ("builder: error: sglang-0.5.9-cu128 is not in matrix.lock: "
                   "run `builder lock --stack sglang-0.5.9-cu128` first\n")


def test_pin_promotes_a_smoke_tested_image_with_its_reference_figures(lock_path, tmp_path, capsys, record_image):
    stack = MATRIX.stack("sglang-0.5.9-cu130")
    lock.lock_stacks([stack], path=lock_path, resolver=resolution_of)
    record_image(stack, IMAGE, ["sglang:0.5.9-cu130-abc"], lock_path)
    report = tmp_path / "bench.json"
    report.write_text(json.dumps(bench_report(mode="baseline", tok_s=90.2, stack=stack.name)))
    status, out, err = run(capsys, "pin", stack.name, "--bench", str(report))
    assert (status, err) == (0, "")
    assert out == (f"sglang-0.5.9-cu130: pinned image {IMAGE} (3 reference figure(s); "
                   "measured: baseline 90.2 tok/s)\n")
    entry = lock.entry(stack, lock_path)
    assert entry["status"] == "pinned"
    assert [(f["mode"], f.get("attention_backend"), f["tok_s"], f["baseline"]) for f in entry["bench"]["reference"]] == [
        ("baseline", "flashinfer", 89.5, True), ("baseline", "triton", 83.9, False), ("eagle3", None, 96.1, True)]
    assert all(f["hardware"]["description"] == "8x NVIDIA RTX PRO 6000 Blackwell, PCIe Gen5, no NVLink"
               for f in entry["bench"]["reference"])


# --- bench/reference.toml ----------------------------------------------------------------------


def test_reference_figures_are_the_deployments():
    figures = reference_figures.load(MATRIX.project.reference_figures, stacks=MATRIX.all_rows())
    flat = {(stack, f["mode"], f.get("attention_backend")): f["tok_s"] for stack, fs in figures.items() for f in fs}
    assert flat == {
        ("sglang-0.5.9-cu130", "baseline", "flashinfer"): 89.5,
        ("sglang-0.5.9-cu130", "baseline", "triton"): 83.9,
        ("sglang-0.5.9-cu130", "eagle3", None): 96.1,
        ("sglang-0.5.9-cu128", "eagle3", None): 54.1,
    }


def test_each_baseline_figure_reaches_its_mode_with_the_backend_it_runs():
    """The figure marked baseline for a mode is what the image's stack.json pins, and it was measured
    with the attention backend the mode runs."""
    figures = reference_figures.load(MATRIX.project.reference_figures, stacks=MATRIX.all_rows())
    for stack in MATRIX.registry_stacks:
        pinned = render.pinned_figures(stack, MATRIX.project.reference_figures)
        for mode in stack.serve.modes:
            marked = [f for f in figures.get(stack.name, []) if f["mode"] == mode.name and f["baseline"]]
            assert [f["tok_s"] for f in marked] == ([pinned[mode.name]] if mode.name in pinned else [])
            if marked:
                assert marked[0].get("attention_backend") in (None, mode.args.get("attention_backend"))


@pytest.mark.parametrize("old, new, message", [
    ('stack = "sglang-0.5.9-cu128"', 'stack = "sglang-0.5.8-cu128"', "figure 4: unknown stack row 'sglang-0.5.8-cu128'"),
    ('mode = "eagle3"\nbaseline = true\ntok_s = 54.1', 'mode = "turbo"\nbaseline = true\ntok_s = 54.1',
     "figure 4: sglang-0.5.9-cu128 has no serve mode 'turbo'"),
    ("tok_s = 54.1", 'tok_s = "fast"', "figure 4: `tok_s` missing or not a number"),
    ("tok_s = 54.1", "tok_s = -1", "figure 4: tok_s must be positive, not -1"),
    ('attention_backend = "triton"\nbaseline = false', 'attention_backend = "triton"\nbaseline = true',
     "sglang-0.5.9-cu130 mode baseline needs exactly one figure with baseline = true"),
    ('hardware = "rtx-pro-6000-blackwell-x8-pcie"\nmodel = "unrecorded (large MoE checkpoint with its EAGLE-3 draft, TP 8)"\n'
     'note = "EAGLE-3 speculative decoding on the CUDA 12.8',
     'hardware = "h100"\nmodel = "unrecorded (large MoE checkpoint with its EAGLE-3 draft, TP 8)"\n'
     'note = "EAGLE-3 speculative decoding on the CUDA 12.8', "figure 4: hardware 'h100' is not described under [hardware]"),
    ("schema = 1", "schema = 2", "unsupported schema 2 (expected 1)"),
])
def test_bad_reference_files_are_one_line_errors(tmp_path, old, new, message):
    assert old in REFERENCE_TEXT, old
    path = tmp_path / "reference.toml"
    path.write_text(REFERENCE_TEXT.replace(old, new, 1))
    with pytest.raises(UserError) as failure:
        reference_figures.load(path, stacks=MATRIX.all_rows())
    assert str(failure.value) == f"{path}: {message}"
