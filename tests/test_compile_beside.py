"""The byte-compile step run beside the step before it (builder/engine/compile_beside.py): which steps it
is, what it reads, when its layer still holds on top of the other's, and, in a real write-once build,
the same image as the engine's sequential build whether the layer is kept or the step runs again."""

import dataclasses
import io
import shutil
import tarfile
from pathlib import Path

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, engine_image, write_context

from builder.engine import compile_beside, step_runner
from builder.engine.buildah import BuildahEngine
from builder.engine.protocol import BuildRequest
from builder.oci import dockerfile_plan

REPO = Path(__file__).resolve().parent.parent
SITE = "/opt/venv/lib/python3.11/site-packages"
COMPILE = (f'RUN ["/usr/bin/env", "PYTHONHASHSEED=0", "/opt/venv/bin/python", "-B", '
           f'"{compile_beside.INSTALL_TOOL}", "compile", "{SITE}"]')


def _step(line: str, env: str = "") -> dockerfile_plan.Step:
    plan = dockerfile_plan.parse(f"FROM scratch\n{env}{line}\n", {})
    return plan.steps[-1]


def test_only_the_templates_compile_step_is_run_beside_and_its_reads_are_named():
    reads = compile_beside.compile_reads(_step(COMPILE), {"PATH": "/usr/bin", "VIRTUAL_ENV": "/opt/venv"})
    assert reads is not None
    assert {"usr", "etc", "opt/venv", SITE.lstrip("/"), compile_beside.INSTALL_TOOL.lstrip("/")} <= set(reads.roots)
    assert compile_beside.compile_reads(_step('RUN ["/bin/true"]'), {}) is None
    assert compile_beside.compile_reads(_step(COMPILE.replace("PYTHONHASHSEED=0", "PYTHONHASHSEED=1")), {}) is None
    # An environment that could send the interpreter or the loader elsewhere: not run beside.
    assert compile_beside.compile_reads(_step(COMPILE), {"PYTHONPATH": "/opt"}) is None
    assert compile_beside.compile_reads(_step(COMPILE), {"LD_PRELOAD": "/x.so"}) is None


@pytest.mark.parametrize("path, read", [
    ("opt/venv/lib/python3.11/site-packages/x.py", True),
    ("opt/venv/.wh.pyvenv.cfg", True),
    ("usr/lib/x86_64-linux-gnu/libc.so.6", True),
    ("root/.local/lib/python3.11/site-packages/a.pth", True),
    ("opt/builder/json.py", True),  # the tool's directory comes first on the module path
    ("opt/builder/runtime/__pycache__/x.pyc", True),
    ("opt/builder/flashinfer-baked/x.so", False),  # no module can have that name
    ("opt/builder/cuda-home/bin/nvcc", False),
    ("opt", False),
    ("cache/flashinfer", False),
    ("tmp/x", False),
])
def test_what_the_compile_reads(path, read):
    reads = compile_beside.compile_reads(_step(COMPILE), {})
    assert reads.covers(path) is read


def _tar(path: Path, entries: list[tuple[str, int]]) -> Path:
    """A layer of directories (name, mode) and, for names with a dot, empty files."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, EPOCH
            info.type = tarfile.REGTYPE if "." in name.rsplit("/", 1)[-1] else tarfile.DIRTYPE
            tar.addfile(info, io.BytesIO(b"") if info.isreg() else None)
    return path


def test_the_layer_holds_unless_the_step_before_wrote_where_it_reads_or_changed_a_shared_parent(tmp_path):
    reads = compile_beside.compile_reads(_step(COMPILE), {})
    compiled_entries = [("opt", 0o755), ("opt/venv", 0o755), ("opt/venv/lib", 0o755),
                        (f"{SITE.lstrip('/')}/__pycache__", 0o755), (f"{SITE.lstrip('/')}/__pycache__/x.pyc", 0o644)]
    compiled = _tar(tmp_path / "compiled.tar", compiled_entries)
    paths = [name for name, _ in compiled_entries]

    apart = _tar(tmp_path / "apart.tar", [("opt", 0o755), ("opt/builder", 0o755), ("opt/builder/flash-baked", 0o755)])
    assert compile_beside.difference(reads, apart, compiled, paths) is None

    inside = _tar(tmp_path / "inside.tar", [("opt", 0o755), ("opt/venv", 0o755), ("opt/venv/lib", 0o755),
                                            ("opt/venv/lib/extra.pth", 0o644)])
    assert compile_beside.difference(reads, inside, compiled, paths) == \
        "the step before it wrote /opt/venv, which the compile reads"

    other_parent = _tar(tmp_path / "parent.tar", [("opt", 0o700), ("opt/builder", 0o755)])
    assert compile_beside.difference(reads, other_parent, compiled, paths) == "/opt differs between the two layers"


def _request(context: Path, tag: str) -> BuildRequest:
    return BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=(tag,), source_date_epoch=EPOCH,
                        build_args={"SOURCE_DATE_EPOCH": str(EPOCH)}, network="none", no_cache=True)


def _context(tmp_path: Path, before_compile: str) -> Path:
    dockerfile = f"""FROM {TEST_BASE_TAG}
ARG SOURCE_DATE_EPOCH
RUN ["/usr/bin/python3", "-m", "venv", "--without-pip", "/opt/venv"]
COPY install_wheels.py {compile_beside.INSTALL_TOOL}
COPY pkg/ {SITE}/pkg/
RUN ["/bin/sh", "-c", "{before_compile}"]
{COMPILE}
"""
    context = write_context(tmp_path / "ctx", dockerfile)
    shutil.copy(REPO / "builder" / "runtime" / "install_wheels.py", context / "install_wheels.py")
    (context / "pkg").mkdir()
    (context / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (context / "pkg" / "mod.py").write_text("def f(x):\n    return [i * x for i in range(3)]\n")
    return context


@pytest.mark.engine
@pytest.mark.parametrize("before_compile, beside", [
    # Writes only where the compile never reads: its layer, made beside, is kept.
    ("mkdir -p /opt/builder/flash-baked && echo made > /opt/builder/flash-baked/out && sleep 1", True),
    # Adds a module the compile must compile: it runs again on top of that step.
    (f"echo 'X = 2' > {SITE}/pkg/late.py", False),
])
def test_a_compile_run_beside_gives_the_engines_image(base_image, tmp_path, monkeypatch, before_compile, beside):
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    engine = BuildahEngine(export_to_docker=False)
    context = _context(tmp_path, before_compile)
    built = engine_image(engine, _request(context, "localhost/compile-beside-engine:1"))
    lines: list[str] = []
    written_tag = "localhost/compile-beside-written:1"
    request = _request(context, written_tag)
    try:
        written = engine.build(dataclasses.replace(request, progress=lines.append))
    finally:
        engine.remove(written_tag)
    assert written.image_id == built.image_id
    assert [layer.diff_id for layer in written.layers] == [layer.diff_id for layer in built.layers]
    ran_beside = [line for line in lines if line.endswith("(run beside line 6)")]
    ran_again = [line for line in lines if line.startswith("line 7: run again on top of line 6: ")]
    assert (len(ran_beside), len(ran_again)) == ((1, 0) if beside else (0, 1))
    if not beside:
        # The first path of that layer the compile reads: the parent of what it wrote, in the layer too.
        assert ran_again == ["line 7: run again on top of line 6: the step before it wrote /opt/venv, which the "
                             "compile reads"]


def test_a_step_in_the_background_gets_the_least_cpu_weight_for_its_container(tmp_path):
    (tmp_path / "etc").mkdir()
    spec = step_runner.runtime_spec(tmp_path, ["/bin/true"], {}, None, None, [], background=True)
    assert spec["linux"]["resources"]["cpu"] == {"shares": 2}
    assert "cpu" not in step_runner.runtime_spec(tmp_path, ["/bin/true"], {}, None, None, [])["linux"]["resources"]
