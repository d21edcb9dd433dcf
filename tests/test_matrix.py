"""Loading, axes expansion and every bad input of matrix.toml, asserting the message and its line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from checkouts import link_project_files
from builder.cli.main import main
from builder.config.matrix import MatrixError, load_matrix

REPO = Path(__file__).resolve().parent.parent
MATRIX_TEXT = (REPO / "matrix.toml").read_text()


def write_matrix(tmp_path: Path, text: str) -> Path:
    """A project of its own: the matrix, with the repository's patch series beside it."""
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    link_project_files(tmp_path)
    return path


def edited(old: str, new: str, count: int = 1) -> str:
    assert old in MATRIX_TEXT, f"fixture text not found: {old!r}"
    return MATRIX_TEXT.replace(old, new, count)


def line_of(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(MatrixError) as caught:
        load_matrix(write_matrix(tmp_path, text))
    return caught.value.problems


def test_real_matrix_expands_axes_into_named_rows():
    matrix = load_matrix(REPO / "matrix.toml")
    assert [s.name for s in matrix.stacks] == ["sglang-0.5.9-cu130", "sglang-0.5.9-cu128", "sglang-0.5.23-cu130"]
    target = matrix.stack("sglang-0.5.9-cu130")
    assert target.cuda == "13.0.1" and target.python == "3.12"
    assert target.package("torch").version == "2.9.1+cu130"
    assert target.package("torch").index == "https://download.pytorch.org/whl/cu130"
    assert target.package("sgl-kernel").url.endswith("sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl")
    assert target.package("flashinfer-jit-cache").version == "0.6.4+cu130"
    assert target.target_arch == ("12.0",)
    assert target.axes == (("cuda", "cu130"),)
    previous = matrix.stack("sglang-0.5.9-cu128")
    assert previous.package("torch").index is None and previous.package("sgl-kernel").version == "0.3.21"
    assert previous.package("flashinfer-jit-cache") is None


def test_serve_profiles_merge_axis_values():
    target = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu130")
    modes = {m.name: m for m in target.serve.modes}
    assert modes["baseline"].args["attention_backend"] == "flashinfer"
    assert modes["baseline"].args["tp_size"] == 8
    assert modes["eagle3"].args["speculative_algorithm"] == "EAGLE3"
    assert modes["eagle3"].requires_draft_model


def test_overrides_carry_the_declared_requirement():
    target = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu130")
    override = target.overrides[0]
    assert (override.package, override.declared_by, override.declared) == ("flashinfer-python", "sglang", "==0.6.3")
    assert "0.6.4" in override.reason


def test_local_base_rows():
    matrix = load_matrix(REPO / "matrix.toml", local_base=True)
    assert [s.name for s in matrix.stacks] == [
        "sglang-0.5.9-cu130-local", "sglang-0.5.9-cu128-local", "sglang-0.5.23-cu130-local"]
    row = matrix.stacks[1]
    assert row.base.local and row.python == "3.11" and row.base.image == "localhost/builder-base:debian-bookworm"
    assert matrix.select(["sglang-0.5.9-cu128"], local_base=True) == (row,)


def test_row_names_are_stable(tmp_path):
    first = load_matrix(REPO / "matrix.toml")
    second = load_matrix(write_matrix(tmp_path, MATRIX_TEXT))
    assert [s.to_dict() for s in first.all_rows()] == [s.to_dict() for s in second.all_rows()]


def test_toml_syntax_error_names_line_and_column(tmp_path):
    text = edited('cache_dir = "/cache"', 'cache_dir = "/cache')
    (problem,) = problems(tmp_path, text)
    assert re.match(rf".*matrix.toml:{line_of(text, 'cache_dir')}:\d+: TOML syntax error", problem)


def test_unknown_key_suggests_closest(tmp_path):
    text = edited('target_arch = ["12.0"]', 'target_arc = ["12.0"]')
    found = problems(tmp_path, text)
    assert f"matrix.toml:{line_of(text, 'target_arc =')}: unknown key 'stack[0].target_arc' (did you mean 'target_arch'?)" in "\n".join(found)


def test_wrong_type(tmp_path):
    text = edited("input_len = 1024", 'input_len = "1024"')
    (problem,) = problems(tmp_path, text)
    assert problem.endswith(f":{line_of(text, 'input_len')}: 'stack[0].bench.input_len' must be an integer, not str")


def test_missing_required_field(tmp_path):
    text = edited('image = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"\n', "")
    (problem,) = problems(tmp_path, text)
    line = line_of(text, '[bases."cuda-12.8.1"]')
    assert problem.endswith(f":{line}: missing required key 'bases.cuda-12.8.1.image'")


def test_missing_field_in_one_axis_row(tmp_path):
    text = edited('base = "cuda-12.8.1"\n', "")
    (problem,) = problems(tmp_path, text)
    assert "missing required key 'stack[0].base' (in the row for cu128)" in problem


def test_duplicate_stack_names(tmp_path):
    start = MATRIX_TEXT.index("[[stack]]")
    text = MATRIX_TEXT + "\n" + MATRIX_TEXT[start:]
    found = problems(tmp_path, text)
    second = [n for n, line in enumerate(text.splitlines(), 1) if line == 'name = "sglang-0.5.9"'][1]
    assert f"matrix.toml:{second}: duplicate stack name 'sglang-0.5.9-cu130'" in "\n".join(found)


def test_name_unusable_as_tag(tmp_path):
    found = problems(tmp_path, edited('name = "sglang-0.5.9"', 'name = "SGLang 0.5.9"'))
    assert "stack name 'SGLang 0.5.9-cu130' is not usable as a tag" in "\n".join(found)


def test_torch_local_tag_against_cuda(tmp_path):
    text = edited('version = "2.9.1+cu130"', 'version = "2.9.1+cu128"')
    found = "\n".join(problems(tmp_path, text))
    line = line_of(text, 'packages.torch = { version = "2.9.1+cu128"')
    assert (f":{line}: sglang-0.5.9-cu130: "
            "torch 2.9.1+cu128 is built for CUDA 12.8 but the stack's CUDA is 13.0.1") in found


def test_default_index_torch_against_cuda(tmp_path):
    text = edited('cuda = "12.8.1"\nbase', 'cuda = "13.0.1"\nbase').replace('base = "cuda-12.8.1"', 'base = "cuda-13.0.1"')
    found = "\n".join(problems(tmp_path, text))
    assert "sglang-0.5.9-cu128: torch 2.9.1 is built for CUDA 12.8 but the stack's CUDA is 13.0.1" in found
    assert "sglang-0.5.9-cu128: sgl-kernel 0.3.21 is built for CUDA 12.9 but the stack's CUDA is 13.0.1" in found


def test_kernel_cuda_tags_against_cuda(tmp_path):
    text = edited('version = "0.6.4+cu130"', 'version = "0.6.4+cu128"')
    found = "\n".join(problems(tmp_path, text))
    assert "flashinfer-jit-cache 0.6.4+cu128 is built for CUDA 12.8 but the stack's CUDA is 13.0.1" in found
    text = edited('version = "0.3.21+cu130"', 'version = "0.3.21+cu129"').replace(
        "sgl_kernel-0.3.21+cu130-", "sgl_kernel-0.3.21+cu129-")
    found = "\n".join(problems(tmp_path, text))
    assert "sgl-kernel 0.3.21+cu129 is built for CUDA 12.9 but the stack's CUDA is 13.0.1" in found


def test_flashinfer_versions_must_match(tmp_path):
    text = edited('flashinfer-cubin = { version = "0.6.4" }', 'flashinfer-cubin = { version = "0.6.3" }')
    found = "\n".join(problems(tmp_path, text))
    # A problem every row shares is one line, named after the [[stack]].
    assert f":{line_of(text, 'flashinfer-cubin = {')}: sglang-0.5.9: flashinfer-cubin 0.6.3 must equal flashinfer-python 0.6.4" in found
    assert found.count("must equal flashinfer-python") == 1
    text = edited('version = "0.6.4+cu130"', 'version = "0.6.5+cu130"')
    found = "\n".join(problems(tmp_path, text))
    assert "flashinfer-jit-cache 0.6.5+cu130 must match flashinfer-python 0.6.4" in found


def test_python_against_wheel_tags(tmp_path):
    text = edited('python = "3.12"', 'python = "3.9"').replace('/usr/bin/python3.12"\nsystem_packages = ["python3.12"', '/usr/bin/python3.9"\nsystem_packages = ["python3.12"', 1)
    found = "\n".join(problems(tmp_path, text))
    assert "sglang-0.5.9-cu130: sgl-kernel 0.3.21+cu130 has no wheel for Python 3.9 (tags: cp310-abi3)" in found
    assert "sglang-0.5.9-cu130: torch 2.9.1+cu130 has no wheel for Python 3.9" in found


def test_patch_series_for_another_version(tmp_path):
    text = edited('sglang = { version = "0.5.9" }', 'sglang = { version = "0.5.8" }')
    found = "\n".join(problems(tmp_path, text))
    assert "the sglang patch series is written for 0.5.23, 0.5.9, but the stack pins 0.5.8" in found


def test_contradicting_pin_needs_an_override(tmp_path):
    start = MATRIX_TEXT.index("[[stack.overrides]]")
    end = MATRIX_TEXT.index("[[stack.overrides]]", start + 1)
    text = MATRIX_TEXT[:start] + MATRIX_TEXT[end:]
    found = "\n".join(problems(tmp_path, text))
    assert (f":{line_of(text, 'flashinfer-python = {')}: sglang-0.5.9: flashinfer-python 0.6.4 contradicts sglang 0.5.9's "
            "requirement flashinfer-python==0.6.3; declare an override with a reason") in found


def test_needless_override_is_refused(tmp_path):
    text = MATRIX_TEXT.replace('flashinfer-python = { version = "0.6.4" }', 'flashinfer-python = { version = "0.6.3" }').replace(
        'flashinfer-cubin = { version = "0.6.4" }', 'flashinfer-cubin = { version = "0.6.3" }').replace(
        'version = "0.6.4+cu130"', 'version = "0.6.3+cu130"')
    found = "\n".join(problems(tmp_path, text))
    assert "override of flashinfer-python by sglang is not needed: no declared requirement is contradicted" in found


def test_unknown_base_suggests(tmp_path):
    found = "\n".join(problems(tmp_path, edited('base = "cuda-12.8.1"', 'base = "cuda-12.8"')))
    assert "unknown base 'cuda-12.8' (did you mean 'cuda-12.8.1'?)" in found


def test_every_problem_reported_at_once(tmp_path):
    text = edited("input_len = 1024", 'input_len = "x"').replace("num_prompts = 8", "num_promts = 8")
    found = problems(tmp_path, text)
    assert len(found) >= 2 and all(re.match(r".*matrix.toml:\d+: ", p) for p in found)


def test_cli_reports_each_problem_on_one_line_with_exit_2(tmp_path, capsys):
    path = write_matrix(tmp_path, edited('target_arch = ["12.0"]', 'target_arc = ["12.0"]'))
    assert main(["matrix", "--matrix", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert all(line.startswith("builder: error: ") for line in err.strip().splitlines())


def test_cli_missing_matrix_file(tmp_path, capsys):
    assert main(["matrix", "--matrix", str(tmp_path / "nope.toml")]) == 2
    assert "cannot read the matrix" in capsys.readouterr().err


def test_cli_unknown_stack(capsys):
    assert main(["matrix", "--matrix", str(REPO / "matrix.toml"), "--stack", "sglang-0.5.9-cu13"]) == 2
    assert "unknown stack 'sglang-0.5.9-cu13' (did you mean 'sglang-0.5.9-cu130'?)" in capsys.readouterr().err
