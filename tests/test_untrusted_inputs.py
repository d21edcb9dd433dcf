"""Untrusted strings stay data (issue 32, items 1-6): nothing from the matrix, the lock or the command
line becomes a Dockerfile instruction, a YAML key, a requirement option, a path outside its root, a
plain-http connection to a look-alike of loopback, or an error line holding a secret.

Two layers, each tested alone: the matrix's grammar refuses every hostile value of every templated
field with one file:line line; and the renderer, handed hostile values past the grammar, still writes
no instruction of theirs (or refuses in one line).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from builder.cache import deb_cache, wheel_cache
from builder.cli.main import main as builder_main
from builder.config.matrix import load_matrix
from builder.engine import buildah
from builder.errors import UserError
from builder.lock import store
from builder.lock.system_packages import DebArchive, DebPackage, SystemPackages
from builder.net import transport_policy
from builder.patches.patch_series import series_for
from builder.paths import Project
from builder.publish import engine_push, registry
from builder.render import compose, render
from checkouts import REPO, link_project_files

MATRIX_TEXT = (REPO / "matrix.toml").read_text()
HOSTILE = {"newline": "\nRUN id", "cr": "\rRUN id", "quote": '"', "backslash": "\\", "nul": "\x00",
           "u2028": "\u2028RUN id", "u2029": "\u2029RUN id", "interpolation": "${HOME}"}


def toml_string(text: str) -> str:
    return json.dumps(text)  # JSON's escapes are TOML basic-string escapes


# Every matrix value that reaches a rendered file: (id, text as matrix.toml has it, its key = "value"
# line with the value replaced). The hostile value is appended to the benign one.
STRING_FIELDS = [
    ("description", 'description = "SGLang 0.5.9 for 8x RTX PRO 6000 Blackwell (SM120) PCIe"'),
    ("venv_python", 'venv_python = "/usr/bin/python3.12"'),
    ("local_venv_python", 'venv_python = "/usr/bin/python3.11"'),
    ("image", 'image = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"'),
    ("repository", 'repository = "sglang"'),
    ("local_base_name", 'name = "debian-bookworm"'),
    ("suite", 'suite = "noble"'),
    ("cache_dir", 'cache_dir = "/cache"'),
    ("env_value", 'SGLANG_DISABLE_CUDNN_CHECK = "1"'),
    ("override_reason", 'reason = "must equal flashinfer-python exactly (flashinfer/jit/env.py), which is overridden to 0.6.4"'),
    ("version", 'sglang = { version = "0.5.9" }'),
    ("index", 'index = "https://download.pytorch.org/whl/cu130"'),
    ("arg_value", 'attention_backend = "flashinfer"'),
    ("axis_description", 'description = "CUDA 13 target stack"'),
]
ITEM_FIELDS = [  # a string inside an array
    ("system_package", '"python3.12-venv"'),
    ("local_package", '"libnuma1"'),
    ("patched", '"flashinfer-python"]'),
]
KEY_FIELDS = [  # a free key the templates write
    ("env_name", "SGLANG_DISABLE_CUDNN_CHECK = "),
]


def _with_hostile(field: str, hostile: str) -> str:
    """matrix.toml with `hostile` appended to the field's value (its first occurrence)."""
    kind, snippet = next((k, s) for k, fields in (("value", STRING_FIELDS), ("item", ITEM_FIELDS), ("key", KEY_FIELDS))
                         for name, s in fields if name == field)
    assert snippet in MATRIX_TEXT, f"matrix.toml no longer has {snippet!r}: update the test"
    if kind == "key":
        new = toml_string(snippet.split(" =")[0] + hostile) + " = "
    elif kind == "item":
        value = snippet.rstrip("]").strip('"')
        new = toml_string(value + hostile) + snippet[len(value) + 2:]
    else:
        key, _, rest = snippet.partition(" = ")
        if rest.startswith("{"):  # inline table: version = "..."
            inner = re.search(r'"([^"]*)"', rest)
            new = key + " = " + rest[:inner.start()] + toml_string(inner.group(1) + hostile) + rest[inner.end():]
        else:
            new = key + " = " + toml_string(json.loads(rest) + hostile)
    return MATRIX_TEXT.replace(snippet, new, 1)


@pytest.fixture
def project(tmp_path, monkeypatch):
    link_project_files(tmp_path)
    monkeypatch.setenv("BUILDER_LOCK", str(REPO / "matrix.lock"))
    return tmp_path


def refusal(project: Path, text: str, capsys, command=("render", "--check")) -> str:
    path = project / "matrix.toml"
    path.write_text(text)
    status = builder_main([*command, "--matrix", str(path)])
    out, err = capsys.readouterr()
    assert status == 2, (status, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.match(re.escape(f"builder: error: {path}:") + r"\d+: ", lines[0]), err
    return lines[0]


ALL_FIELDS = [name for fields in (STRING_FIELDS, ITEM_FIELDS, KEY_FIELDS) for name, _ in fields]


@pytest.mark.parametrize("hostile", list(HOSTILE), ids=list(HOSTILE))
@pytest.mark.parametrize("field", ALL_FIELDS)
def test_every_templated_field_refuses_every_hostile_value_in_one_line(project, capsys, field, hostile):
    line = refusal(project, _with_hostile(field, HOSTILE[hostile]), capsys)
    # The value is quoted escaped: the line cannot be split by it.
    assert "\x00" not in line and "\r" not in line and "\u2028" not in line and "\u2029" not in line


@pytest.mark.parametrize("value", ['"30000; id"', "30000.5", "true", "0", "70000", "-1", "nan"])
def test_a_port_that_is_not_an_integer_in_range_is_a_file_line_error_not_a_traceback(project, capsys, value):
    text = MATRIX_TEXT.replace("port = 30000", f"port = {value}", 1)
    line = refusal(project, text, capsys)
    assert "port" in line


@pytest.mark.parametrize("key, value", [
    ("regression_tolerance", "nan"), ("regression_tolerance", "inf"), ("regression_tolerance", "-inf"),
    ("regression_tolerance", "-0.1"), ("regression_tolerance", "1.5"),
    ("input_len", "0"), ("output_len", "-5"), ("input_len", "99999999999"), ("num_prompts", "0"),
    ("num_prompts", "10000000"),
])
def test_bench_numbers_are_finite_and_in_range(project, capsys, key, value):
    text = re.sub(rf"^{key} = .*$", f"{key} = {value}", MATRIX_TEXT, count=1, flags=re.M)
    assert key in refusal(project, text, capsys, ("matrix",))


@pytest.mark.parametrize("url, why", [
    ("http://download.pytorch.org/whl/cu130", "plain http"),
    ("file:///etc/whl", "scheme"),
    ("ftp://download.pytorch.org/whl/cu130", "scheme"),
    ("https://user:hunter2secret@download.pytorch.org/whl/cu130", "user name or password"),
    ("http://localhost.evil.example/whl", "plain http"),
    ("http://127.0.0.1.evil.example/whl", "plain http"),
    ("https://download.pytorch.org/whl/cu130 --trusted-host evil", "not a URL"),
])
def test_index_urls_are_https_with_no_userinfo_and_no_message_prints_a_secret(project, capsys, url, why):
    line = refusal(project, MATRIX_TEXT.replace("https://download.pytorch.org/whl/cu130", url, 1), capsys)
    assert why in line
    assert "hunter2secret" not in line


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/simple", "http://[::1]:8080/simple", "http://localhost:1/x",
                                 "http://127.3.4.5/simple"])
def test_plain_http_to_loopback_is_allowed_for_test_indexes(project, capsys, url):
    path = project / "matrix.toml"
    path.write_text(MATRIX_TEXT.replace("https://download.pytorch.org/whl/cu130", url, 1))
    assert builder_main(["matrix", "--matrix", str(path)]) == 0, capsys.readouterr().err


def test_a_wheel_url_with_userinfo_is_refused_without_printing_it(project, capsys):
    text = MATRIX_TEXT.replace("https://github.com/", "https://bot:ghp_secrettoken@github.com/", 1)
    assert "ghp_secrettoken" in text
    line = refusal(project, text, capsys, ("matrix",))
    assert "ghp_secrettoken" not in line and "user name or password" in line


# ---- the registry on the command line and the engines' TLS -----------------------------------------


@pytest.mark.parametrize("argument", ["user:pw-s3cret@registry.example:5000", "https://user:pw-s3cret@registry.example"])
def test_registry_with_userinfo_is_refused_and_the_line_prints_no_password(argument):
    with pytest.raises(UserError) as refused:
        registry.split_registry(argument)
    assert "pw-s3cret" not in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("host, verify", [
    ("localhost.evil.example", True), ("localhost.evil.example:5000", True), ("127.0.0.1.evil.example", True),
    ("127.0.0.1.evil.example:5000", True), ("[::1].evil", True), ("registry.example", True),
    ("localhost:5000", False), ("127.0.0.1:5000", False), ("127.9.9.9", False), ("[::1]:5000", False),
])
def test_buildah_push_verifies_tls_unless_the_parsed_host_is_loopback(monkeypatch, host, verify):
    seen = []

    def run_quiet(argv, what):
        seen.append(argv)
        Path(argv[argv.index("--digestfile") + 1]).write_text("sha256:" + "a" * 64)

    monkeypatch.setattr(buildah, "run_quiet", run_quiet)
    engine_push.push(buildah.BuildahEngine(export_to_docker=False), "sha256:" + "b" * 64, f"{host}/r:t", host, None,
                     lambda message: False, transport_policy.Policy())
    assert seen[0][0] == "buildah" and seen[0][-2:] == ["sha256:" + "b" * 64, f"docker://{host}/r:t"]
    assert f"--tls-verify={'true' if verify else 'false'}" in seen[0]
    assert ("--tls-verify=false" in seen[0]) is not verify
    assert (transport_policy.Policy().kind(host) is transport_policy.Kind.LOOPBACK) is not verify


# ---- lock values that would become paths ---------------------------------------------------------------

LOCK = json.loads((REPO / "matrix.lock").read_text())


def _locked_row() -> str:
    return next(name for name, entry in LOCK["stacks"].items() if entry["resolution"]["distributions"])


def _damaged_lock(tmp_path: Path, change) -> Path:
    data = json.loads(json.dumps(LOCK))
    change(data["stacks"][_locked_row()]["resolution"])
    path = tmp_path / "matrix.lock"
    path.write_text(json.dumps(data, indent=2))
    return path


def _first_distribution(resolution) -> dict:
    return resolution["distributions"][sorted(resolution["distributions"])[0]]


def _deb_row(data) -> dict:
    return next(e["resolution"] for e in data["stacks"].values() if e["resolution"].get("system_packages"))


LOCK_DAMAGE = {
    "wheel escapes": lambda r: _first_distribution(r).update(wheel="../../escaped.whl"),
    "wheel of another name": lambda r: _first_distribution(r).update(wheel="evil-1.0-py3-none-any.whl"),
    "sha256 is a path": lambda r: _first_distribution(r).update(sha256="../../../outside"),
    "sha256 upper case": lambda r: _first_distribution(r).update(sha256=_first_distribution(r)["sha256"].upper()),
    "source with userinfo": lambda r: _first_distribution(r).update(source="https://u:p@index.example/simple"),
    "source over plain http": lambda r: _first_distribution(r).update(source="http://index.example/simple"),
    "version with a newline": lambda r: _first_distribution(r).update(version="1.0\n--index-url https://evil.example"),
    "distributions_hash edited": lambda r: r.update(distributions_hash="0" * 64),
    "distributions_hash missing": lambda r: r.pop("distributions_hash"),
    "base digest injects": lambda r: r["base"].update(manifest_digest="sha256:" + "a" * 64 + "\nRUN id",
                                                      image_id=None, local=False),
}


@pytest.mark.parametrize("damage", list(LOCK_DAMAGE))
def test_a_lock_value_outside_its_grammar_is_refused_when_read(tmp_path, damage):
    path = _damaged_lock(tmp_path, LOCK_DAMAGE[damage])
    with pytest.raises(UserError) as refused:
        store.read(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: malformed lock, refused: ") and "\n" not in message
    assert "u:p@" not in message


@pytest.mark.parametrize("damage", [
    lambda p: p.update(filename="pool/main/../../../../etc/x_1_amd64.deb"),
    lambda p: p.update(filename="/etc/passwd"),
    lambda p: p.update(filename="pool/main/p/x_1_amd64.tar"),
    lambda p: p.update(sha256="../../outside"),
    lambda p: p.update(archive=99),
], ids=["dotdot", "absolute", "not-a-deb", "sha-path", "archive-index"])
def test_a_locked_deb_outside_its_grammar_is_refused(tmp_path, damage):
    data = json.loads(json.dumps(LOCK))
    damage(_deb_row(data)["system_packages"]["packages"][0])
    path = tmp_path / "matrix.lock"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="malformed lock"):
        store.read(path)


def test_lock_check_fails_in_one_line_for_a_missing_or_malformed_lock(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BUILDER_LOCK", str(tmp_path / "absent.lock"))
    assert builder_main(["lock", "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no lock to check" in err
    monkeypatch.setenv("BUILDER_LOCK", str(_damaged_lock(tmp_path, LOCK_DAMAGE["distributions_hash edited"])))
    assert builder_main(["lock", "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "distributions_hash" in err


def test_the_committed_lock_reads_and_checks_as_valid():
    store.read(REPO / "matrix.lock")  # every value within its grammar, every stored hash its own


# ---- the caches: presence is not proof ---------------------------------------------------------


def _wheel(tmp_path: Path, content: bytes) -> wheel_cache.LockedWheel:
    import hashlib
    return wheel_cache.LockedWheel("demo", "1.0", "demo-1.0-py3-none-any.whl", hashlib.sha256(content).hexdigest(),
                                   "default index")


def test_a_planted_wrong_hash_wheel_is_removed_and_reported_as_missing(tmp_path, capsys):
    cache = wheel_cache.WheelCache(tmp_path / "cache")
    wheel = _wheel(tmp_path, b"the real wheel")
    cache.path(wheel).parent.mkdir(parents=True)
    cache.path(wheel).write_bytes(b"planted")
    assert cache.missing((wheel,)) == [wheel]
    assert not cache.path(wheel).exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not hash to its sha256" in err
    with pytest.raises(UserError, match="lacks 1 of 1"):
        cache.require((wheel,), "offline build")


def test_a_checked_wheel_is_not_hashed_again_until_it_changes(tmp_path, monkeypatch, capsys):
    from builder.cache import content_check
    cache = wheel_cache.WheelCache(tmp_path / "cache")
    wheel = _wheel(tmp_path, b"the real wheel")
    cache.path(wheel).parent.mkdir(parents=True)
    cache.path(wheel).write_bytes(b"the real wheel")
    assert cache.missing((wheel,)) == []
    hashed = []
    monkeypatch.setattr(content_check, "sha256_file", lambda path: hashed.append(path) or "0" * 64)
    assert cache.missing((wheel,)) == []
    assert hashed == []  # its record still matches
    cache.path(wheel).write_bytes(b"the real wheel, damaged")
    assert cache.missing((wheel,)) == [wheel]
    assert hashed and not cache.path(wheel).exists()
    with pytest.raises(BaseException):
        cache.link_into((wheel,), tmp_path / "context")


def test_a_planted_wrong_hash_deb_is_removed_and_reported_as_missing(tmp_path, capsys):
    import hashlib
    content = b"the real deb"
    package = DebPackage("demo", "1.0", "amd64", "pool/main/d/demo/demo_1.0_amd64.deb", len(content),
                         hashlib.sha256(content).hexdigest(), 0)
    locked = SystemPackages("debian", "amd64", "root", ("demo",),
                            (DebArchive("debian", "bookworm", ("main",), "", ""),), (package,))
    cache = deb_cache.DebCache(tmp_path / "debs")
    cache.path(package).parent.mkdir(parents=True)
    cache.path(package).write_bytes(b"planted!!!!!")  # same size, other bytes
    assert cache.missing(locked) == [package]
    assert not cache.path(package).exists()
    assert "did not hash to its sha256" in capsys.readouterr().err


@pytest.mark.parametrize("sha, name", [("../../../outside", "demo-1.0-py3-none-any.whl"),
                                       ("a" * 64, "../../escaped.whl")])
def test_a_cache_path_refuses_lock_values_that_would_leave_it(tmp_path, sha, name):
    wheel = wheel_cache.LockedWheel("demo", "1.0", name, sha, "default index")
    with pytest.raises(UserError):
        wheel_cache.WheelCache(tmp_path).path(wheel)


# ---- patches stay inside the repository ----------------------------------------------------------


def test_a_patch_that_is_a_symlink_out_of_the_patches_folder_is_refused(tmp_path):
    root = tmp_path / "patches"
    shutil.copytree(REPO / "patches" / "sglang", root / "sglang")
    series = next((root / "sglang").glob("*/series"))
    name = next(n for n in series.read_text().split() if n.endswith(".patch"))
    outside = tmp_path / "outside.patch"
    shutil.copy(series.parent / name, outside)
    (series.parent / name).unlink()
    (series.parent / name).symlink_to(outside)
    with pytest.raises(UserError, match="symlinks are refused"):
        series_for("sglang", series.parent.name, root)


# ---- the second layer: the renderer escapes what the grammar let through --------------------------


# The instructions whose arguments the engine expands variables in (exec-form RUN, CMD, ENTRYPOINT: never).
_SUBSTITUTED = {"ADD", "COPY", "ENV", "EXPOSE", "FROM", "LABEL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}


def _instruction_texts(dockerfile: str) -> list[str]:
    texts, continued = [], False
    for line in dockerfile.split("\n"):
        if continued:
            texts[-1] += "\n" + line
        elif line.strip() and not line.lstrip().startswith("#"):
            texts.append(line)
        continued = line.endswith("\\")
    return texts


def _instructions(dockerfile: str) -> list[str]:
    """Each instruction's keyword, continuation lines joined, comments and blanks skipped."""
    return [text.split()[0] for text in _instruction_texts(dockerfile)]


MATRIX = load_matrix(REPO / "matrix.toml")
ROW = MATRIX.stack("sglang-0.5.9-cu128")
LOCAL_ROW = MATRIX.stack("sglang-0.5.9-cu128-local")


def _hostile_rows(value: str):
    """The row with one field replaced by a hostile value, bypassing the grammar: (field, row)."""
    base = ROW.base
    mode = ROW.serve.modes[0]
    yield "description", dataclasses.replace(ROW, description="SGLang" + value)
    yield "repository", dataclasses.replace(ROW, repository="sglang" + value)
    yield "image", dataclasses.replace(ROW, base=dataclasses.replace(base, image="nvidia/cuda:12" + value))
    yield "venv_python", dataclasses.replace(ROW, base=dataclasses.replace(base, venv_python="/usr/bin/python3" + value))
    yield "system_packages", dataclasses.replace(ROW, base=dataclasses.replace(
        base, system_packages=base.system_packages + ("patch" + value,)))
    yield "local base name", dataclasses.replace(LOCAL_ROW, base=dataclasses.replace(LOCAL_ROW.base, name="deb" + value))
    yield "cache_dir", dataclasses.replace(ROW, serve=dataclasses.replace(ROW.serve, cache_dir="/cache" + value))
    yield "env value", dataclasses.replace(ROW, serve=dataclasses.replace(ROW.serve, env={"X": "1" + value}))
    yield "env name", dataclasses.replace(ROW, serve=dataclasses.replace(ROW.serve, env={"X" + value: "1"}))
    yield "mode name", dataclasses.replace(ROW, serve=dataclasses.replace(
        ROW.serve, modes=(dataclasses.replace(mode, name="m" + value),)))
    yield "port", dataclasses.replace(ROW, serve=dataclasses.replace(
        ROW.serve, modes=(dataclasses.replace(mode, args={**mode.args, "port": "30000" + value}),)))
    yield "source_url", dataclasses.replace(ROW, source_url="https://example.org/x" + value)
    yield "override reason", dataclasses.replace(ROW, overrides=tuple(
        dataclasses.replace(o, reason=o.reason + value) for o in ROW.overrides))
    package = ROW.packages[0]
    yield "version", dataclasses.replace(ROW, packages=(dataclasses.replace(package, version="1.0" + value),
                                                       *ROW.packages[1:]))
    yield "index", dataclasses.replace(ROW, packages=(dataclasses.replace(package, index="https://i.example" + value),
                                                     *ROW.packages[1:]))


def _render(row):
    return render.render_stack(row, Project(REPO), lambda stack: None)


BENIGN = {row.name: _render(row) for row in (ROW, LOCAL_ROW)}


@pytest.mark.parametrize("hostile", list(HOSTILE), ids=list(HOSTILE))
def test_escaping_alone_keeps_hostile_values_out_of_the_instructions_and_yaml(hostile):
    value = HOSTILE[hostile]
    for field, row in _hostile_rows(value):
        try:
            files = _render(row)
        except UserError as refused:  # a value with no escaped form where it lands
            assert "\n" not in str(refused), (field, str(refused))
            continue
        benign = BENIGN[row.name]
        context = f"images/{row.name}"
        dockerfile = files[f"{context}/Dockerfile"]
        assert _instructions(dockerfile) == _instructions(benign[f"{context}/Dockerfile"]), field
        # Nothing splits a line where only "\n" is a line break to the engine, nor where Unicode breaks lines.
        assert dockerfile.splitlines() == dockerfile.split("\n")[:-1], field
        for instruction in _instruction_texts(dockerfile):  # the engine substitutes variables in these
            if instruction.split()[0] in _SUBSTITUTED:
                assert not re.search(r"(?<!\\)\$\{HOME\}", instruction), (field, instruction)
        for name, text in files.items():
            if name.endswith(".txt"):  # requirement lines: no line starts another option of the value's
                assert text.count("\n") == benign[name].count("\n"), (field, name)
        parsed = yaml.safe_load(files[f"{context}/compose.yaml"])
        services = parsed["services"]
        if field == "mode name":
            assert list(services) == ["m" + value]
        else:
            assert list(services) == list(yaml.safe_load(benign[f"{context}/compose.yaml"])["services"]), field
        environment = next(iter(services.values()))["environment"]
        if field == "env value":
            assert environment["X"] == compose.literal("1" + value)
        if field == "env name":
            assert "X" + value in environment


def test_label_and_comment_escapes():
    from builder import escape
    assert escape.label("a${X}b") == '"a\\${X}b"'
    assert escape.label('plain text') == '"plain text"'
    assert escape.comment("plain") == "plain" and escape.comment("a\nRUN id") == '"a\\nRUN id"'
    with pytest.raises(UserError):
        escape.bare("image\nRUN id")
