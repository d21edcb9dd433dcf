"""Patch series discovery, the strict in-image applier, check/refresh logic and the CLI.

No network here: the upstream wheels are small wheels these tests build, so
every failure path (fuzz, failed hunk, corrupted patch, missing file) is
exercised deterministically. tests/test_patches_upstream.py runs the same code
against the real sglang and flashinfer wheels.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.cli import main as cli_main
from builder.errors import UserError
from builder.patches import patch_series
from builder.runtime import apply_patch
REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "patches"
APPLY_PATCH = REPO / "builder" / "runtime" / "apply_patch.py"
EPOCH = "1767225600"


def module_source(variant: str = "", shift: int = 0) -> str:
    """A small module whose table gets a new row in the patched version."""
    lines = [f"# filler {i}" for i in range(shift)]
    lines += ["MiB = 1024 * 1024", "", "SIZES = {"]
    lines += ["    9: {2: 64 * MiB, 4: 64 * MiB},", "    10: {2: 64 * MiB, 4: 64 * MiB},"]
    if variant:
        lines.append(variant)
    lines += ["}", "", "", "def size(capability, world):", "    return SIZES[capability][world]", ""]
    return "\n".join(lines)


def make_diff(tmp: Path, rel: str, old: str, new: str) -> str:
    (tmp / "a").mkdir(exist_ok=True)
    (tmp / "b").mkdir(exist_ok=True)
    (tmp / "a" / "x").write_text(old)
    (tmp / "b" / "x").write_text(new)
    result = subprocess.run(
        ["diff", "-u", "--label", f"a/{rel}", "--label", f"b/{rel}", str(tmp / "a" / "x"), str(tmp / "b" / "x")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    return result.stdout


HEADER = "Subject: demo: SM120 row\n\nWhat: adds capability 12.\nWhy: KeyError otherwise.\n\n"
NEW_ROW = "    12: {2: 64 * MiB, 4: 64 * MiB},"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    (root / "demo").mkdir(parents=True)
    (root / "demo" / "__init__.py").write_text("")
    (root / "demo" / "table.py").write_text(module_source())
    (root / "demo" / "other.py").write_text("VALUE = 1\n")
    return root


@pytest.fixture
def patch_file(tmp_path: Path) -> Path:
    work = tmp_path / "diffwork"
    work.mkdir()
    body = make_diff(work, "demo/table.py", module_source(), module_source(NEW_ROW))
    path = tmp_path / "0001-demo-sm120.patch"
    path.write_text(HEADER + body)
    return path


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", str(APPLY_PATCH), *args],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip


# --- apply_patch.py: the in-image applier ---------------------------------------


def test_apply_patch_is_stdlib_only():
    tree = ast.parse(APPLY_PATCH.read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    imported.discard("__future__")
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_applies_and_byte_compiles_checked_hash(site: Path, patch_file: Path):
    cache = site / "demo" / "__pycache__"
    cache.mkdir()
    stale = [cache / "table.cpython-311.pyc", cache / "table.cpython-312.opt-1.pyc"]
    for path in stale:
        path.write_bytes(b"stale")
    unrelated = cache / "table_helpers.cpython-311.pyc"
    unrelated.write_bytes(b"keep")

    result = run_cli("--site-packages", str(site), str(patch_file), env={"SOURCE_DATE_EPOCH": EPOCH})

    assert result.returncode == 0, result.stderr
    assert "applied 0001-demo-sm120.patch: demo/table.py" in result.stdout
    assert NEW_ROW in (site / "demo" / "table.py").read_text()
    fresh = cache / f"table.{sys.implementation.cache_tag}.pyc"
    assert fresh.exists()
    flags = int.from_bytes(fresh.read_bytes()[4:8], "little")
    assert flags == 0b11, "SOURCE_DATE_EPOCH must give checked-hash .pyc"
    assert int((site / "demo" / "table.py").stat().st_mtime) == int(EPOCH)
    assert not any(p.exists() for p in stale if p != fresh)
    assert unrelated.read_bytes() == b"keep"
    leftovers = [p.name for p in site.rglob("*") if p.suffix in (".orig", ".rej")]
    assert leftovers == []


def test_offsets_are_accepted_and_reported(site: Path, patch_file: Path):
    (site / "demo" / "table.py").write_text(module_source(shift=3))
    applied = apply_patch.apply(str(site), str(patch_file))
    assert applied.files == ("demo/table.py",)
    assert applied.offsets == ("demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) offset +3 lines",)


def test_failed_hunk_names_patch_file_and_hunk_and_changes_nothing(site: Path, tmp_path: Path):
    work = tmp_path / "w"
    work.mkdir()
    two_files = make_diff(work, "demo/other.py", "VALUE = 1\n", "VALUE = 2\n")
    two_files += make_diff(work, "demo/table.py", module_source(), module_source(NEW_ROW))
    patch = tmp_path / "0002-two-files.patch"
    patch.write_text(HEADER + two_files)
    # The table's context differs from what the patch expects: no fuzz allowed.
    (site / "demo" / "table.py").write_text(module_source().replace("    10: {2", "    10: {1"))

    result = run_cli("--site-packages", str(site), str(patch))

    assert result.returncode == 1
    assert result.stderr.strip() == (
        "apply_patch: error: patch 0002-two-files.patch: "
        "demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) FAILED at line 3"
    )
    assert (site / "demo" / "other.py").read_text() == "VALUE = 1\n", "dry run first: nothing half-applied"
    assert [p.name for p in site.rglob("*") if p.suffix in (".orig", ".rej")] == []


def test_fuzz_is_refused(site: Path, patch_file: Path):
    # Only the outermost context line differs: GNU patch's default fuzz would take it.
    (site / "demo" / "table.py").write_text(module_source().replace("SIZES = {", "SIZES = {  # by capability"))
    with pytest.raises(apply_patch.PatchError) as caught:
        apply_patch.apply(str(site), str(patch_file))
    assert caught.value.problems == ("demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) FAILED at line 3",)
    fuzzy = apply_patch.run_patch(str(site), str(patch_file), dry_run=True, fuzz=2)
    assert fuzzy.ok and fuzzy.fuzz == ("demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) matched with fuzz 1",)


def test_corrupted_patch_is_refused_naming_the_hunk(site: Path, patch_file: Path, tmp_path: Path):
    corrupted = tmp_path / "corrupted.patch"
    text = patch_file.read_text()
    corrupted.write_text(text.replace(NEW_ROW + "\n", ""))  # the hunk now has fewer lines than it says
    result = run_cli("--site-packages", str(site), str(corrupted))
    assert result.returncode == 1
    assert "patch corrupted.patch: demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) malformed" in result.stderr
    assert (site / "demo" / "table.py").read_text() == module_source()


def test_already_applied_is_refused(site: Path, patch_file: Path):
    apply_patch.apply(str(site), str(patch_file))
    with pytest.raises(apply_patch.PatchError, match=r"demo/table.py already applied"):
        apply_patch.apply(str(site), str(patch_file))


def test_missing_target_file_is_named(site: Path, patch_file: Path):
    (site / "demo" / "table.py").unlink()
    with pytest.raises(apply_patch.PatchError) as caught:
        apply_patch.apply(str(site), str(patch_file))
    assert caught.value.problems == ("demo/table.py not found in site-packages",)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("/dev/null", "b/demo/new.py"), "create or delete files are not supported"),
        (("a/../etc/passwd", "b/../etc/passwd"), "unsafe or unstripped path"),
        (("a/demo/x.py", "b/demo/y.py"), "renames demo/x.py to demo/y.py"),
    ],
)
def test_unsupported_diffs_are_refused(tmp_path: Path, names, message):
    patch = tmp_path / "bad.patch"
    patch.write_text(f"--- {names[0]}\n+++ {names[1]}\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(apply_patch.PatchError, match=message):
        apply_patch.read_patch(str(patch))


# The review's finding: GNU patch reads every diff format it finds in a file, so a
# context diff after a unified hunk changed demo/other.py while apply_patch named
# only demo/table.py (and byte-compiled only that).
CONTEXT_DIFF_FOR_OTHER = (
    "*** a/demo/other.py\n--- b/demo/other.py\n***************\n*** 1 ****\n! VALUE = 1\n--- 1 ----\n! VALUE = 666\n"
)


def test_context_diff_after_a_unified_hunk_is_refused_and_nothing_changes(site: Path, patch_file: Path,
                                                                          tmp_path: Path):
    smuggled = tmp_path / "0004-smuggled.patch"
    smuggled.write_text(patch_file.read_text() + CONTEXT_DIFF_FOR_OTHER)

    result = run_cli("--site-packages", str(site), str(smuggled))

    assert result.returncode == 1
    assert result.stderr.strip() == (
        "apply_patch: error: patch 0004-smuggled.patch: line 16 ('*** a/demo/other.py') is a context diff; "
        "only unified diffs are applied"
    )
    assert (site / "demo" / "other.py").read_text() == "VALUE = 1\n"
    assert (site / "demo" / "table.py").read_text() == module_source()


UNIFIED_OTHER = "--- a/demo/other.py\n+++ b/demo/other.py\n@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 2\n"


@pytest.mark.parametrize(
    ("where", "text", "kind"),
    [
        ("after", CONTEXT_DIFF_FOR_OTHER, "a context diff"),
        ("after", "***************\n*** 1 ****\n", "a context diff"),
        ("before", CONTEXT_DIFF_FOR_OTHER, "a context diff"),  # GNU patch reads the header too
        ("after", "1c1\n< VALUE = 1\n---\n> VALUE = 2\n", "a normal diff or ed script command"),
        ("before", "1c\nVALUE = 2\n.\nw\n", "a normal diff or ed script command"),
        ("after", "3,4d\n", "a normal diff or ed script command"),
        ("after", "1s/1/2/\n", "a normal diff or ed script command"),
        ("after", "diff --git a/demo/blob b/demo/blob\nGIT binary patch\nliteral 5\nMcmZ\n", "a binary patch"),
        ("after", "Binary files a/demo/blob and b/demo/blob differ\n", "a binary patch"),
        ("after", "diff --git a/demo/other.py b/demo/other.py\nold mode 100644\nnew mode 100755\n",
         "a git mode, rename or copy header"),
        ("after", "diff --git a/demo/other.py b/demo/moved.py\nrename from demo/other.py\n",
         "a git mode, rename or copy header"),
        ("after", "diff --git a/demo/other.py b/demo/other.py\n", "a git diff without a unified body"),
        ("after", "+VALUE = 3\n", "not part of a unified diff"),
        ("after", "Index: demo/other.py\n", "not part of a unified diff"),
        ("after", "-- \n2.43.0\n" + UNIFIED_OTHER, "a diff after the patch's \"-- \" signature"),
    ],
)
def test_every_diff_that_is_not_unified_is_refused(site: Path, patch_file: Path, tmp_path: Path,
                                                     where, text, kind):
    unified = patch_file.read_text()
    patch = tmp_path / "0005-mixed.patch"
    patch.write_text(text + unified if where == "before" else unified + text)
    with pytest.raises(apply_patch.PatchError) as caught:
        apply_patch.apply(str(site), str(patch))
    (problem,) = caught.value.problems
    assert re.fullmatch(rf"line \d+ \(.*\) is {re.escape(kind)}; only unified diffs are applied", problem), problem
    assert (site / "demo" / "other.py").read_text() == "VALUE = 1\n"
    assert (site / "demo" / "table.py").read_text() == module_source()


def test_git_format_patch_layout_still_applies(site: Path, patch_file: Path, tmp_path: Path):
    body = patch_file.read_text()[len(HEADER):]
    patch = tmp_path / "0006-format-patch.patch"
    patch.write_text(
        "From 1234 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] demo\n\n---\n demo/table.py | 1 +\n\n"
        "diff --git a/demo/table.py b/demo/table.py\nindex 0123abc..4567def 100644\n" + body
        + "diff --git a/demo/other.py b/demo/other.py\nindex 89abcde..f012345 100644\n" + UNIFIED_OTHER
        + "-- \n2.43.0\n\n"
    )  # fmt: skip
    applied = apply_patch.apply(str(site), str(patch))
    assert applied.files == ("demo/table.py", "demo/other.py")
    assert NEW_ROW in (site / "demo" / "table.py").read_text()
    assert (site / "demo" / "other.py").read_text() == "VALUE = 2\n"


def test_gnu_patch_touching_a_file_the_patch_does_not_name_is_a_problem(patch_file: Path):
    # The second layer: even if a diff GNU patch reads slipped past the reader, its report is checked.
    diffs = apply_patch.read_patch(str(patch_file))
    outcome = apply_patch.interpret("patching file demo/table.py\npatching file demo/other.py\n", 0, diffs)
    assert not outcome.ok
    assert outcome.problems == ("demo/other.py: GNU patch would change it, but the patch names no such file",)


def test_lines_split_only_at_newlines_as_gnu_patch_splits_them(site: Path, tmp_path: Path):
    # A form feed (Python's page break) inside a line is not a line break for GNU patch.
    (site / "demo" / "other.py").write_text("VALUE = 1\n\x0c\nOTHER = 1\n")
    work = tmp_path / "w"
    work.mkdir()
    patch = tmp_path / "0007-form-feed.patch"
    patch.write_text(make_diff(work, "demo/other.py", "VALUE = 1\n\x0c\nOTHER = 1\n", "VALUE = 2\n\x0c\nOTHER = 1\n"))
    apply_patch.apply(str(site), str(patch))
    assert (site / "demo" / "other.py").read_text() == "VALUE = 2\n\x0c\nOTHER = 1\n"


def test_text_without_a_diff_is_refused(tmp_path: Path):
    patch = tmp_path / "empty.patch"
    patch.write_text(HEADER)
    with pytest.raises(apply_patch.PatchError, match="no unified diff found"):
        apply_patch.read_patch(str(patch))


def test_apply_patch_bad_input_exits_2(site: Path, patch_file: Path, tmp_path: Path):
    missing_patch = run_cli("--site-packages", str(site), str(tmp_path / "nope.patch"))
    assert missing_patch.returncode == 2
    assert "patch file" in missing_patch.stderr and "does not exist" in missing_patch.stderr
    missing_site = run_cli("--site-packages", str(tmp_path / "nowhere"), str(patch_file))
    assert missing_site.returncode == 2
    assert "is not a directory" in missing_site.stderr


def test_syntax_error_after_patching_fails_the_layer(site: Path, tmp_path: Path):
    work = tmp_path / "w"
    work.mkdir()
    patch = tmp_path / "0003-broken.patch"
    patch.write_text(make_diff(work, "demo/other.py", "VALUE = 1\n", "VALUE = (\n"))
    result = run_cli("--site-packages", str(site), str(patch))
    assert result.returncode == 1
    assert "patch 0003-broken.patch: demo/other.py: does not compile after patching" in result.stderr


# --- series discovery --------------------------------------------------------------


def write_series(root: Path, dist: str, version: str, series: str, files: dict[str, str]) -> Path:
    directory = root / dist / version
    directory.mkdir(parents=True)
    (directory / "series").write_text(series)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_series_order_hash_and_files(tmp_path: Path, patch_file: Path):
    text = patch_file.read_text()
    other = text.replace("demo/table.py", "demo/other.py")
    write_series(
        tmp_path, "demo-pkg", "1.0",
        "# comment line\n0002-b.patch  # trailing comment\n\n0001-a.patch\n",
        {"0001-a.patch": text, "0002-b.patch": other},
    )  # fmt: skip
    found = patch_series.series_for("Demo_Pkg", "1.0", root=tmp_path)
    assert [p.name for p in found] == ["0002-b.patch", "0001-a.patch"]
    assert found[1].sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert found[0].files == ("demo/other.py",)
    assert found[0].distribution == "demo-pkg"


@pytest.mark.parametrize(
    ("series", "files", "message"),
    [
        ("0001-a.patch\n0001-a.patch\n", {"0001-a.patch": "P"}, "series:2: 0001-a.patch is listed twice"),
        ("../x.patch\n", {}, "series:1: '../x.patch' is not a patch file name"),
        ("0001-a.diff\n", {}, "series:1: '0001-a.diff' is not a patch file name"),
        ("# nothing\n", {}, "lists no patches"),
        ("0001-a.patch\n", {}, "lists 0001-a.patch, which does not exist"),
        ("0001-a.patch\n", {"0001-a.patch": "P", "0002-b.patch": "P"}, "0002-b.patch not listed"),
        ("0001-a.patch\n", {"0001-a.patch": "just words\n"}, "0001-a.patch: no unified diff found"),
    ],
)
def test_bad_series_is_refused(tmp_path: Path, patch_file: Path, series, files, message):
    texts = {name: (patch_file.read_text() if text == "P" else text) for name, text in files.items()}
    write_series(tmp_path, "demo", "1.0", series, texts)
    with pytest.raises(UserError, match=re.escape(message)):
        patch_series.series_for("demo", "1.0", root=tmp_path)


def test_unknown_version_names_the_missing_series(tmp_path: Path):
    with pytest.raises(UserError, match=r"no patch series for sglang 9\.9\.9"):
        patch_series.series_for("sglang", "9.9.9", root=tmp_path)
    with pytest.raises(UserError, match="'latest' is not a valid version"):
        patch_series.series_for("sglang", "latest", root=tmp_path)


def test_repository_series_cover_the_sm120_gaps():
    assert patch_series.all_series(PATCHES) == [
        ("flashinfer-python", "0.6.4"), ("sglang", "0.5.23"), ("sglang", "0.5.9")]
    symm_mem = (
        "sglang/srt/distributed/device_communicators/all_reduce_utils.py",
        "sglang/srt/distributed/device_communicators/torch_symm_mem.py",
    )
    sglang = patch_series.series_for("sglang", "0.5.9", PATCHES)
    assert [p.files for p in sglang] == [symm_mem, ("sglang/srt/layers/communicator.py",)]
    # 0.5.23 decides the fusion backend in flashinfer_comm_fusion.py and applies it in add_norm.py.
    ported = patch_series.series_for("sglang", "0.5.23", PATCHES)
    assert [p.files for p in ported] == [symm_mem, (
        "sglang/srt/layers/flashinfer_comm_fusion.py", "sglang/srt/layers/layer_boundary/residual/add_norm.py")]
    flashinfer = patch_series.series_for("flashinfer-python", "0.6.4", PATCHES)
    assert [p.files for p in flashinfer] == [("flashinfer/jit/comm.py",)]
    for patch in sglang + ported + flashinfer:
        header = patch_series.patch_header(patch.path)
        assert "What:" in header and "Why:" in header and "Upstream:" in header, patch.name
        assert patch.path.stat().st_size < 64 * 1024, patch.name
        # Nothing an environment variable already does belongs in a patch.
        assert "cudnn" not in patch.path.read_text().lower(), patch.name


# --- check and refresh against small wheels made here --------------------------------


def build_wheel(cache: Path, version: str, source: str) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / f"demo-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "")
        archive.writestr("demo/table.py", source)
        archive.writestr("demo/other.py", "VALUE = 1\n")
    return wheel


@pytest.fixture
def demo_root(tmp_path: Path, patch_file: Path) -> Path:
    root = tmp_path / "patches"
    write_series(root, "demo", "1.0", "# demo series\n0001-demo-sm120.patch\n", {"0001-demo-sm120.patch": patch_file.read_text()})
    return root


def test_check_series_applies_in_a_temporary_tree(tmp_path: Path, demo_root: Path):
    cache = tmp_path / "cache"
    wheel = build_wheel(cache, "1.0", module_source())
    check = patch_series.check_series("demo", "1.0", root=demo_root, cache=cache)
    assert check.ok
    assert check.wheel == wheel.name
    assert check.wheel_sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert check.results[0].compiled == ("demo/table.py",)
    lines = patch_series.format_check(check)
    assert lines[1].startswith("  applied 0001-demo-sm120.patch sha256 ")


def test_check_series_reports_the_failing_hunk(tmp_path: Path, demo_root: Path):
    cache = tmp_path / "cache"
    build_wheel(cache, "1.0", module_source().replace("    10: {2", "    10: {1"))
    check = patch_series.check_series("demo", "1.0", root=demo_root, cache=cache)
    assert not check.ok
    assert patch_series.format_check(check)[1:] == [
        "  FAILED  0001-demo-sm120.patch",
        "    demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) FAILED at line 3",
    ]


def test_refresh_regenerates_offsets_and_leaves_fuzz_to_a_person(tmp_path: Path, demo_root: Path, patch_file: Path):
    cache = tmp_path / "cache"
    build_wheel(cache, "1.1", module_source(shift=4))
    outcomes = patch_series.refresh_series("demo", "1.0", "1.1", root=demo_root, cache=cache)
    assert outcomes == [
        patch_series.Refreshed(
            "0001-demo-sm120.patch", True, ("demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) offset +4 lines",)
        )
    ]
    refreshed = (demo_root / "demo" / "1.1" / "0001-demo-sm120.patch").read_text()
    assert refreshed.startswith(HEADER)
    assert "@@ -7,6 +7,7 @@" in refreshed
    assert (demo_root / "demo" / "1.1" / "series").read_text().splitlines()[1:] == ["0001-demo-sm120.patch"]
    again = patch_series.check_series("demo", "1.1", root=demo_root, cache=cache)
    assert again.ok and again.results[0].offsets == ()

    build_wheel(cache, "1.2", module_source().replace("SIZES = {", "SIZES = {  # by capability"))
    fuzzy = patch_series.refresh_series("demo", "1.0", "1.2", root=demo_root, cache=cache)
    assert fuzzy == [
        patch_series.Refreshed(
            "0001-demo-sm120.patch", False, ("demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) matched with fuzz 1",)
        )
    ]
    assert not (demo_root / "demo" / "1.2" / "0001-demo-sm120.patch").exists()
    with pytest.raises(UserError, match="lists 0001-demo-sm120.patch, which does not exist"):
        patch_series.series_for("demo", "1.2", root=demo_root)


def test_refresh_refuses_an_existing_target(demo_root: Path, tmp_path: Path):
    with pytest.raises(UserError, match="already exists"):
        patch_series.refresh_series("demo", "1.0", "1.0", root=demo_root, cache=tmp_path / "cache")


# --- the CLI ---------------------------------------------------------------------------


def test_cli_check_exit_codes(tmp_path: Path, demo_root: Path, monkeypatch, capsys):
    monkeypatch.chdir(demo_root.parent)  # the project: patches/ beside the (default) matrix.toml
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "builder-cache"))
    build_wheel(tmp_path / "builder-cache" / "dists", "1.0", module_source())
    assert cli_main.main(["patches", "check", "--package", "demo", "--version", "1.0"]) == 0
    assert "applied 0001-demo-sm120.patch" in capsys.readouterr().out

    (demo_root / "demo" / "1.0" / "0001-demo-sm120.patch").write_text(
        patch_series.patch_header(demo_root / "demo" / "1.0" / "0001-demo-sm120.patch")
        + make_diff(tmp_path, "demo/table.py", module_source("    11: {},"), module_source(NEW_ROW))
    )
    assert cli_main.main(["patches", "check"]) == 1
    out = capsys.readouterr().out
    assert "FAILED  0001-demo-sm120.patch" in out and "demo/table.py: hunk #1" in out


def test_cli_refresh_exit_codes(tmp_path: Path, demo_root: Path, monkeypatch, capsys):
    monkeypatch.chdir(demo_root.parent)
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "builder-cache"))
    build_wheel(tmp_path / "builder-cache" / "dists", "1.1", module_source(shift=2))
    build_wheel(tmp_path / "builder-cache" / "dists", "1.2", module_source().replace("    10: {2", "    10: {1"))

    assert cli_main.main(["patches", "refresh", "--package", "demo", "--from", "1.0", "--to", "1.1"]) == 0
    out = capsys.readouterr().out
    assert "  refreshed 0001-demo-sm120.patch\n    demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) offset +2 lines" in out
    assert out.rstrip().endswith(f"wrote {demo_root / 'demo' / '1.1'}")

    assert cli_main.main(["patches", "refresh", "--package", "demo", "--from", "1.0", "--to", "1.2"]) == 1
    out = capsys.readouterr().out
    assert "  NEEDS A PERSON 0001-demo-sm120.patch\n    demo/table.py: hunk #1 (@@ -3,6 +3,7 @@) FAILED at line 3" in out
    assert "still to do by hand: 0001-demo-sm120.patch" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["patches", "check", "--package", "sglang", "--version", "0.0.1"], "no patch series for sglang 0.0.1"),
        (["patches", "check", "--package", "sglang"], "--package and --version go together"),
        (["patches", "check", "--stack", "x", "--package", "sglang", "--version", "0.5.9"], "not both"),
        (["patches", "check", "--matrix", str(REPO / "matrix.toml"), "--stack", "nope"], "unknown stack 'nope'"),
        (["patches", "refresh", "--package", "sglang", "--from", "0.0.1", "--to", "0.5.9"], "no patch series"),
        (["patches", "refresh", "--package", "sglang", "--from", "0.5.9", "--to", "0.5.9"], "already exists"),
    ],
)
def test_cli_bad_input_exits_2(argv, message, capsys):
    assert cli_main.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("builder: error: ") and message in err
