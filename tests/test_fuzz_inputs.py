"""Property-based fuzzing of what users type: the real matrix.toml damaged every way a hand or a tool
damages it, every string of it given hostile text (refused, or rendered as data), the real matrix.lock
damaged (through `lock --check` and `render --check`), and the image entrypoint's arguments and
environment. Every command either works (exit 0)
or refuses with `builder: error:` lines (exit 2); a traceback fails the test and hypothesis shrinks
it to the smallest input that shows it.

Bounded and repeatable: a fixed number of examples per property (BUILDER_FUZZ_EXAMPLES scales it for a
deeper local run), derandomized so CI sees the same inputs on every run, and no example database.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkouts import link_project_files
from builder.cli.main import main as builder_main
from builder.runtime.serve import entrypoint, preflight, supervise
from standin_sglang import harness

REPO = Path(__file__).resolve().parent.parent
MATRIX_TEXT = (REPO / "matrix.toml").read_text()
LINES = MATRIX_TEXT.splitlines(keepends=True)
_ASSIGNMENT = re.compile(r"^(\s*[A-Za-z0-9_.\"-]+\s*=\s*)(.*?)(\s*)$", re.DOTALL)
_INNER_VALUE = re.compile(r"(=\s*)(\"[^\"]*\"|[^,}\s]+)")
ASSIGNMENTS = [i for i, line in enumerate(LINES) if _ASSIGNMENT.match(line) and not line.lstrip().startswith("#")]
HEADERS = [i for i, line in enumerate(LINES) if line.lstrip().startswith("[")]


def examples(count: int):
    """`count` examples, scaled by BUILDER_FUZZ_EXAMPLES / 100 when set; derandomized, no database."""
    scale = int(os.environ.get("BUILDER_FUZZ_EXAMPLES", "100")) / 100
    return settings(max_examples=max(1, int(count * scale)), derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           # each example resets what it uses of capsys and monkeypatch
                                           HealthCheck.function_scoped_fixture])


# ---- TOML values of every type, extreme numbers and odd Unicode ----------------------------------

ODD_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
        st.sampled_from(["\u200b", "\u202e", "\ufeff", "\u0301", "\u00a0", "\U0001f600", "\\", '"', "\n", "\x00"]),
    ),
    max_size=24,
)
EXTREME_INTEGERS = st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, -(2**63), 99999999999999999, 253402300800])
INTEGERS = st.one_of(EXTREME_INTEGERS, st.integers(min_value=-(2**63), max_value=2**63 - 1))
FLOATS = st.floats(allow_nan=True, allow_infinity=True)


def toml_float(value: float) -> str:
    text = repr(value)
    return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(text, text)


SCALARS = st.one_of(
    ODD_TEXT.map(lambda s: json.dumps(s, ensure_ascii=False)),
    INTEGERS.map(str),
    FLOATS.map(toml_float),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.sampled_from(["1979-05-27T07:32:00Z", "1979-05-27", "07:32:00", '""', "'literal'", '"0.6.4"', '"13.0.1"']),
)
TOML_VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
    st.lists(st.tuples(st.sampled_from(["version", "index", "url", "args", "x"]), SCALARS), max_size=2).map(
        lambda pairs: "{ " + ", ".join(f"{k} = {v}" for k, v in dict(pairs).items()) + " }"),
)


# ---- mutations of the real matrix.toml ------------------------------------------------------------


@st.composite
def byte_damage(draw) -> bytes:
    data = bytearray(MATRIX_TEXT.encode())
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(data) - 1))
        byte = draw(st.integers(0, 255))
        operation = draw(st.sampled_from(["replace", "insert", "delete"]))
        if operation == "replace":
            data[position] = byte
        elif operation == "insert":
            data.insert(position, byte)
        else:
            del data[position]
    return bytes(data)


@st.composite
def value_swap(draw) -> str:
    """One value replaced by a value of any type: the whole right-hand side, or one inside an inline table."""
    lines = list(LINES)
    for _ in range(draw(st.integers(1, 2))):
        index = draw(st.sampled_from(ASSIGNMENTS))
        key, value, end = _ASSIGNMENT.match(lines[index]).groups()
        inner = list(_INNER_VALUE.finditer(value))
        new = draw(TOML_VALUES)
        if inner and draw(st.booleans()):
            match = draw(st.sampled_from(inner))
            value = value[: match.start(2)] + new + value[match.end(2):]
        else:
            value = new
        lines[index] = key + value + end
    return "".join(lines)


def _section(start: int) -> tuple[int, int]:
    """A table from its header to the line before the next header."""
    later = [h for h in HEADERS if h > start]
    return start, (later[0] if later else len(LINES))


@st.composite
def removal(draw) -> str:
    lines = list(LINES)
    if draw(st.booleans()):
        del lines[draw(st.sampled_from(ASSIGNMENTS))]
    else:
        start, end = _section(draw(st.sampled_from(HEADERS)))
        del lines[start:end]
    return "".join(lines)


@st.composite
def duplication(draw) -> str:
    """A key or a whole table written twice: as it is, or under another spelling of its key."""
    lines = list(LINES)
    if draw(st.booleans()):
        index = draw(st.sampled_from(ASSIGNMENTS))
        copy = lines[index]
        if draw(st.booleans()):
            key, value, end = _ASSIGNMENT.match(copy).groups()
            copy = key.replace("-", "_").replace("packages.torch", "packages.Torch") + value + end
        lines.insert(draw(st.integers(index + 1, len(lines))), copy)
    else:
        start, end = _section(draw(st.sampled_from(HEADERS)))
        at = end if draw(st.booleans()) else len(lines)  # right after itself, or at the end of the file
        lines[at:at] = ["\n", *LINES[start:end]]
    return "".join(lines)


@st.composite
def odd_unicode(draw) -> str:
    position = draw(st.integers(0, len(MATRIX_TEXT)))
    return MATRIX_TEXT[:position] + draw(ODD_TEXT.filter(bool)) + MATRIX_TEXT[position:]


MATRIX_COMMANDS = [
    ["matrix"],
    ["matrix", "--json", "--local-base"],
    ["matrix", "--github"],
    ["render", "--check"],
    ["push", "sglang-0.5.9-cu128", "--registry", "127.0.0.1:5199"],
    ["pin", "sglang-0.5.9-cu130"],
]
_PROBLEM_LINE = "builder: error: {path}:{position}: "


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="builder-fuzz-") as folder:
        link_project_files(Path(folder))
        yield Path(folder)


def check_commands(content: str | bytes, scratch: Path, capsys) -> None:
    path = scratch / "matrix.toml"
    path.write_bytes(content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content)
    os.environ["BUILDER_LOCK"] = str(scratch / "absent.lock")  # push and pin stop at the lock: nothing runs
    try:
        for command in MATRIX_COMMANDS:
            status = builder_main([*command, "--matrix", str(path)])
            out, err = capsys.readouterr()
            stale = command[0] == "render" and status == 1 and err.endswith("run `builder render`\n")
            assert status in (0, 2) or stale, (command, status, err)
            if status == 2:
                lines = err.splitlines()
                assert lines and all(line.startswith("builder: error: ") for line in lines), err
                if command[0] in ("matrix", "render"):  # the matrix is all they read: each line is file:line
                    position = re.compile(re.escape(f"builder: error: {path}") + r"(:\d+(:\d+)?)?: ")
                    assert all(position.match(line) for line in lines), err
            elif status == 0:
                assert out
    finally:
        del os.environ["BUILDER_LOCK"]


@examples(60)
@given(damaged=byte_damage())
def test_byte_damage(damaged, scratch, capsys):
    check_commands(damaged, scratch, capsys)


@examples(80)
@given(text=value_swap())
def test_values_swapped_between_types(text, scratch, capsys):
    check_commands(text, scratch, capsys)


@examples(40)
@given(text=removal())
def test_keys_and_tables_removed(text, scratch, capsys):
    check_commands(text, scratch, capsys)


@examples(40)
@given(text=duplication())
def test_keys_and_tables_duplicated(text, scratch, capsys):
    check_commands(text, scratch, capsys)


@examples(30)
@given(text=odd_unicode())
def test_odd_unicode_anywhere(text, scratch, capsys):
    check_commands(text, scratch, capsys)


# ---- the image's entrypoint: arguments and environment ---------------------------------------------

ODD_VALUES = st.one_of(
    ODD_TEXT.filter(lambda s: "\x00" not in s),
    INTEGERS.map(str),
    FLOATS.map(repr),
    st.sampled_from(["", "-1", "0", "1e9", "nan", "inf", "-inf", "--", "-h"]),
)
COUNTS = st.one_of(st.integers(-2, 16).map(str), st.sampled_from(["8", "1"]))
SECONDS = st.one_of(st.sampled_from(["30", "0.5", "0", "-5", "nan", "inf", "1e400", "five"]), FLOATS.map(repr))
ADDRESSES = st.sampled_from(["127.0.0.1:5000", "[::1]:5000", "node0:29500", "node0", "node0:", ":5000",
                             "[::1", "node0:99999", "node0:x"])
URLS = st.sampled_from(["http://127.0.0.1:30000", "https://node0", "http://[::1]:30000/", "notaurl", "http://[::1",
                        "http://host:99999", "http://host:0", "ftp://host", "http://", "//host:1", "http://h:x"])
PATHS = st.sampled_from(["/models/M", "/models/D", "relative/dir", "", "/", "/dev/null"])
# What each option is given: mostly values of its own kind, sometimes anything.
OPTION_VALUES = {
    "--mode": st.sampled_from(["baseline", "eagle3", "turbo"]),
    "--model": PATHS, "--draft-model": PATHS, "--cache-dir": PATHS, "--log-file": PATHS, "--output": PATHS,
    "--tp": COUNTS, "--nnodes": COUNTS, "--node-rank": COUNTS, "--input-len": COUNTS, "--output-len": COUNTS,
    "--repetitions": COUNTS, "--warmup": COUNTS,
    "--port": st.one_of(st.integers(-1, 70000).map(str), st.just("30000")),
    "--host": st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "localhost", "", "host name"]),
    "--api-key": ODD_VALUES,
    "--dist-init-addr": ADDRESSES, "--url": URLS,
    "--stall-timeout": SECONDS, "--start-timeout": SECONDS, "--stop-timeout": SECONDS,
    "--reference": SECONDS, "--tolerance": st.sampled_from(["0.03", "0", "1", "-0.1", "nan", "inf", "x"]),
}
SERVE_OPTIONS = ["--mode", "--model", "--draft-model", "--tp", "--port", "--host", "--api-key", "--nnodes",
                 "--node-rank", "--dist-init-addr", "--cache-dir", "--log-file", "--stall-timeout", "--start-timeout",
                 "--stop-timeout"]
BENCH_OPTIONS = SERVE_OPTIONS + ["--url", "--input-len", "--output-len", "--repetitions", "--warmup", "--reference",
                                 "--tolerance", "--output"]
ENVIRONMENT = {"ENTRYPOINT_STALL_TIMEOUT": SECONDS, "ENTRYPOINT_START_TIMEOUT": SECONDS,
               "ENTRYPOINT_STOP_TIMEOUT": SECONDS, "CUDA_VISIBLE_DEVICES": st.sampled_from(["0,1", "", "-1", "GPU-x"])}


@st.composite
def entrypoint_call(draw) -> tuple[list[str], dict]:
    """A command line that would work, given a few more options of their own kind (sometimes anything)."""
    kind = draw(st.sampled_from(["serve", "bench-launch", "bench-url", "tokens"]))
    if kind == "tokens":
        argv = draw(st.lists(st.one_of(st.sampled_from(["serve", "bench", "smoke-x", "--mode", "--", "-h"]),
                                       ODD_VALUES), max_size=4))
        return argv, {}
    mode = draw(OPTION_VALUES["--mode"])
    argv = ["bench" if kind.startswith("bench") else "serve", "--mode", mode]
    if kind == "bench-url":
        argv += ["--url", draw(URLS)]
        options = [o for o in BENCH_OPTIONS if o not in ("--mode", "--url", "--model", "--draft-model")]
    else:
        argv += ["--model", draw(PATHS)] + (["--draft-model", draw(PATHS)] if mode == "eagle3" else [])
        options = [o for o in (BENCH_OPTIONS if kind == "bench-launch" else SERVE_OPTIONS)
                   if o not in ("--mode", "--url", "--model", "--draft-model")]
    for name in draw(st.lists(st.sampled_from(options), max_size=3, unique=True)):
        argv += [name, draw(ODD_VALUES if draw(st.integers(0, 9)) == 0 else OPTION_VALUES[name])]
    if kind != "bench-url" and draw(st.integers(0, 4)) == 0:
        argv += ["--", *draw(st.lists(st.sampled_from(["--port", "--mem-fraction-static", "0.8", "--tp=2", "x"]),
                                      max_size=3))]
    environment = {name: draw(ENVIRONMENT[name])
                   for name in draw(st.lists(st.sampled_from(sorted(ENVIRONMENT)), max_size=2, unique=True))}
    return argv, environment


class Started(Exception):
    """Where the entrypoint would start work: the server process, or the first request to a server."""


def eight_gpus(plan, environ, driver_requirement):
    """Pre-flight on a ready host (its own checks have their own tests): the launch goes on."""
    return preflight.PreflightReport(("GPU",) * 8, (), (), ())


@examples(150)
@given(call=entrypoint_call())
def test_entrypoint_arguments_and_environment(call, monkeypatch, capsys):
    argv, environment = call
    with monkeypatch.context() as patch:
        for name in ENVIRONMENT:
            patch.delenv(name, raising=False)
        for name, value in environment.items():
            patch.setenv(name, value)
        patch.setenv("BUILDER_STACK_JSON", str(harness.FIXTURE))

        def start(*args, **kwargs):
            raise Started()

        patch.setattr(preflight, "run_preflight", eight_gpus)
        patch.setattr(supervise.Supervisor, "run", start)  # would start the server
        patch.setattr(urllib.request, "urlopen", start)  # would ask a server
        try:
            status = entrypoint.main(argv)
        except Started:
            status = 0
        except SystemExit as exit_:  # --help
            status = exit_.code
    out, err = capsys.readouterr()
    assert status in (0, 2), (argv, environment, status, err)
    if status == 2:
        lines = err.splitlines()
        assert lines and all(line.startswith("entrypoint: error: ") for line in lines), err


# ---- matrix.lock damaged: every reader refuses it in lines of its own, or reads what is valid -----------

LOCK_TEXT = (REPO / "matrix.lock").read_text()
LOCK_DATA = json.loads(LOCK_TEXT)


def _leaf_paths(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaf_paths(item, path + (key,))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaf_paths(item, path + (index,))
    else:
        yield path


# Leaves of the resolutions (what builds read), sampled so the file's size does not weigh the draw.
LOCK_LEAVES = [path for path in _leaf_paths(LOCK_DATA) if "resolution" in path][::7]
HOSTILE_LOCK_VALUES = st.one_of(
    ODD_TEXT, INTEGERS, FLOATS.filter(lambda f: f == f and abs(f) != float("inf")), st.none(), st.booleans(),
    st.sampled_from(["../../escaped.whl", "../../../outside", "/etc/passwd", "sha256:" + "0" * 64, "0" * 64,
                     "http://index.example/simple", "https://u:p@index.example/simple", "x.whl\nRUN id", [], {}]),
)


@st.composite
def damaged_lock(draw) -> str:
    if draw(st.integers(0, 3)) == 0:  # bytes damaged anywhere
        data = bytearray(LOCK_TEXT.encode())
        for _ in range(draw(st.integers(1, 3))):
            position = draw(st.integers(0, len(data) - 1))
            data[position] = draw(st.integers(32, 126))
        return data.decode("utf-8", "replace")
    data = json.loads(LOCK_TEXT)
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(LOCK_LEAVES))
        holder = data
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = draw(HOSTILE_LOCK_VALUES)
    return json.dumps(data, indent=2, sort_keys=True)


@examples(40)
@given(text=damaged_lock())
def test_damaged_lock_through_lock_check_and_render_check(text, scratch, capsys):
    path = scratch / "fuzzed.lock"
    path.write_text(text)
    os.environ["BUILDER_LOCK"] = str(path)
    try:
        for command in (["lock", "--check"], ["render", "--check"]):
            status = builder_main([*command, "--matrix", str(REPO / "matrix.toml")])
            out, err = capsys.readouterr()
            assert status in (0, 1, 2), (command, status, err)
            if status:
                lines = err.splitlines()
                assert lines and all(line.startswith("builder: error: ") for line in lines), err
            if status == 2:
                assert len(err.splitlines()) == 1, err  # the lock is refused in one line
    finally:
        del os.environ["BUILDER_LOCK"]


# ---- every string of the matrix given any text: refused in file:line lines, or rendered as data -------

STRING_VALUES = [(index, match.start(2), match.end(2))
                 for index in ASSIGNMENTS
                 for match in re.finditer(r'(=\s*)("(?:[^"\\]|\\.)*")', LINES[index])]
HOSTILE_TEXT = st.one_of(
    ODD_TEXT,
    st.sampled_from(["\nRUN id", "\rRUN id", '"', "\\", "\x00", "\u2028", "\u2029", "${HOME}", "$$", "}", "' #",
                     "a b", "/../..", ":ro", "@", "--index-url https://evil.example"]),
)


def _keywords(dockerfile: str) -> list[str]:
    words, continued = [], False
    for line in dockerfile.split("\n"):
        if not continued and line.strip() and not line.lstrip().startswith("#"):
            words.append(line.split()[0])
        continued = line.endswith("\\")
    return words


def _rendered(matrix_path: Path) -> dict:
    from builder.config.matrix import load_matrix
    from builder.render import render
    matrix = load_matrix(matrix_path)
    return render.render_all(matrix.all_rows(), matrix.project, lambda stack: None)


BENIGN_RENDER = {}


@examples(60)
@given(choice=st.sampled_from(STRING_VALUES), extra=HOSTILE_TEXT, keep=st.booleans())
def test_every_matrix_string_is_refused_or_rendered_as_data(choice, extra, keep, scratch, capsys):
    from builder.errors import UserError
    index, start, end = choice
    old = json.loads(LINES[index][start:end])
    lines = list(LINES)
    lines[index] = LINES[index][:start] + json.dumps((old if keep else "") + extra) + LINES[index][end:]
    path = scratch / "matrix.toml"
    path.write_text("".join(lines), encoding="utf-8", errors="surrogatepass")
    status = builder_main(["matrix", "--matrix", str(path)])
    out, err = capsys.readouterr()
    assert status in (0, 2), err
    if status == 2:
        position = re.compile(re.escape(f"builder: error: {path}") + r"(:\d+(:\d+)?)?: ")
        assert err and all(position.match(line) for line in err.splitlines()), err
        return
    if not BENIGN_RENDER:
        (scratch / "benign.toml").write_text(MATRIX_TEXT)
        BENIGN_RENDER.update(_rendered(scratch / "benign.toml"))
    try:
        files = _rendered(path)
    except UserError as refused:
        assert "\n" not in str(refused)
        return
    for name, text in files.items():
        assert text.splitlines() == text.split("\n")[:-1], name  # no line break but "\n"
        if name.endswith("Dockerfile") and name in BENIGN_RENDER:
            assert _keywords(text) == _keywords(BENIGN_RENDER[name]), name
        if name.endswith("compose.yaml"):
            import yaml
            assert isinstance(yaml.safe_load(text)["services"], dict), name
