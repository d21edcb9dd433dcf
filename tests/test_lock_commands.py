"""`builder lock` and `builder pin` from the command line, and the reference figures they record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.config import reference_figures
from builder.lock import store
from builder.lock.resolution import lock_stacks
from builder.cli.main import main
from builder.errors import UserError
from builder.config.matrix import load_matrix
from checkouts import link_project_files
from lock_values import IMAGE, base_digest_of, bench_report, resolution_of, system_packages_of

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
    lock_stacks([stack], path=lock_path, resolver=resolution_of, base_resolver=base_digest_of, apt_resolver=system_packages_of)
    record_image(stack, IMAGE, ["sglang:0.5.9-cu130-abc"], lock_path)
    report = tmp_path / "bench.json"
    report.write_text(json.dumps(bench_report(mode="baseline", tok_s=90.2, stack=stack.name)))
    status, out, err = run(capsys, "pin", stack.name, "--bench", str(report))
    assert (status, err) == (0, "")
    assert out == (f"sglang-0.5.9-cu130: pinned image {IMAGE} (2 reference figure(s); "
                   "measured: baseline 90.2 tok/s)\n")
    outcome = store.entry(stack.name, lock_path).outcome
    assert outcome.status == "pinned"
    assert [(f["mode"], f["attention_backend"], f["tok_s"], f["pinned"]) for f in outcome.bench.reference] == [
        ("baseline", "triton", 83.9, False), ("eagle3", "flashinfer", 96.1, True)]
    assert all(f["hardware"]["description"] == "8x NVIDIA RTX PRO 6000 Blackwell, PCIe Gen5, no NVLink"
               for f in outcome.bench.reference)


# --- bench/reference.toml ----------------------------------------------------------------------


def test_reference_figures_are_the_deployments():
    """Each figure on the row the deployment's notes put it on, with the backend as they give it."""
    figures = reference_figures.load(MATRIX.project.reference_figures, stacks=MATRIX.all_rows())
    flat = {(stack, f["mode"], f["attention_backend"], f["pinned"]): f["tok_s"] for stack, fs in figures.items() for f in fs}
    assert flat == {
        ("sglang-0.5.9-cu128", "baseline", "likely flashinfer", True): 89.5,
        ("sglang-0.5.9-cu128", "eagle3", "not recorded", True): 54.1,
        ("sglang-0.5.9-cu130", "baseline", "triton", False): 83.9,
        ("sglang-0.5.9-cu130", "eagle3", "flashinfer", True): 96.1,
    }
    for figure in (f for fs in figures.values() for f in fs):
        assert figure["source"] == "deployment notes"
        assert figure["model"].startswith("not recorded: Kimi K2.5 INT4 or GLM-5 NVFP4")


def test_a_pinned_figure_was_measured_with_the_backend_its_mode_runs(tmp_path):
    """83.9 was triton: pinning it to the baseline mode, which runs flashinfer, is refused."""
    bad = tmp_path / "reference.toml"
    bad.write_text(REFERENCE_TEXT.replace("pinned = false", "pinned = true", 1))
    with pytest.raises(UserError) as failure:
        reference_figures.load(bad, stacks=MATRIX.all_rows())
    assert str(failure.value) == (f"{bad}: figure 3: pinned, but measured with attention backend triton while "
                                  "mode baseline runs flashinfer")


@pytest.mark.parametrize("old, new, message", [
    ('stack = "sglang-0.5.9-cu128"', 'stack = "sglang-0.5.8-cu128"', "figure 1: unknown stack row 'sglang-0.5.8-cu128'"),
    ('mode = "eagle3"\nattention_backend = "not recorded"', 'mode = "turbo"\nattention_backend = "not recorded"',
     "figure 2: sglang-0.5.9-cu128 has no serve mode 'turbo'"),
    ("tok_s = 54.1", 'tok_s = "fast"', "figure 2: `tok_s` missing or not a number"),
    ("tok_s = 54.1", "tok_s = -1", "figure 2: tok_s must be positive, not -1"),
    ('source = "deployment notes"\npinned = true', 'pinned = true', "figure 1: `source` missing or not a string"),
    ('tok_s = 96.1', 'tok_s = 96.1\nbaseline = true', "figure 4: unknown key(s) baseline"),
    ('after the switch to --attention-backend flashinfer"',
     'after the switch to --attention-backend flashinfer"\n[[figure]]\nstack = "sglang-0.5.9-cu130"\nmode = "eagle3"\n'
     'attention_backend = "flashinfer"\ntok_s = 90.0\nmodel = "m"\nhardware = "rtx-pro-6000-blackwell-x8-pcie"\n'
     'source = "s"\npinned = true',
     "sglang-0.5.9-cu130 mode eagle3 has more than one figure with pinned = true"),
    ('hardware = "rtx-pro-6000-blackwell-x8-pcie"\nsource = "deployment notes"\npinned = false',
     'hardware = "h100"\nsource = "deployment notes"\npinned = false', "figure 3: hardware 'h100' is not described under [hardware]"),
    ("schema = 2", "schema = 1", "unsupported schema 1 (expected 2)"),
])
def test_bad_reference_files_are_one_line_errors(tmp_path, old, new, message):
    assert old in REFERENCE_TEXT, old
    path = tmp_path / "reference.toml"
    path.write_text(REFERENCE_TEXT.replace(old, new, 1))
    with pytest.raises(UserError) as failure:
        reference_figures.load(path, stacks=MATRIX.all_rows())
    assert str(failure.value) == f"{path}: {message}"


def test_matrix_views_take_the_base_digest_from_the_lock(lock_path, capsys):
    cu128 = MATRIX.stack("sglang-0.5.9-cu128")
    lock_stacks([cu128], path=lock_path, resolver=resolution_of, base_resolver=base_digest_of, apt_resolver=system_packages_of)
    status, out, _ = run(capsys, "matrix", "--github")
    rows = {row["stack"]: row["base_image"] for row in json.loads(out)["include"]}
    assert status == 0
    assert rows == {"sglang-0.5.9-cu128": "nvidia/cuda@" + base_digest_of(cu128.base.image),
                    "sglang-0.5.9-cu130": "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04",
                    "sglang-0.5.23-cu130": "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"}
    status, out, _ = run(capsys, "matrix")
    lines = {line.split()[0]: line for line in out.splitlines()[1:3]}
    assert "cuda-13.0.1 (unpinned)" in lines["sglang-0.5.9-cu130"]
    assert "cuda-12.8.1 " in lines["sglang-0.5.9-cu128"] and "unpinned" not in lines["sglang-0.5.9-cu128"]
