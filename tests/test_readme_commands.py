"""The README's commands table against the CLI itself: every command (and subcommand) `builder --help`
lists has a row, every flag a row names is in that command's `--help`, and every flag in a command's
`--help` is named in its rows.

The table is the first `| command | what it does |` table under "## Commands". A row's first cell names
its commands in code spans (`builder lock [--check]`, `pin`, `patches check \\| refresh`); its flags are
the ones in those spans and in the second cell's spans that begin with a flag (`--load` ...), so prose
about other tools (`docker run --gpus`) is not read as ours.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from builder.cli.main import build_parser

README = Path(__file__).resolve().parent.parent / "README.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")
CODE_SPAN = re.compile(r"`([^`]+)`")
CELL_BORDER = re.compile(r"(?<!\\)\|")  # `\|` inside a cell is a literal bar
HELP_FLAGS = {"--help"}


def help_text(path: tuple[str, ...], monkeypatch) -> str:
    """What `builder PATH --help` prints (wrapped wide, so no line breaks inside an option's names)."""
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*path, "--help"])
    assert exited.value.code == 0
    return out.getvalue()


def listed_choices(text: str) -> list[str]:
    """The subcommands a help text lists: the 4-space-indented names under its positional arguments."""
    section = text.partition("positional arguments:")[2].partition("\noptions:")[0]
    return re.findall(r"^    ([a-z][\w-]*)(?:\s{2,}|$)", section, re.MULTILINE)


def option_flags(text: str) -> set[str]:
    """The long flags of a help text's options: the names at the start of each option's line."""
    section = text.partition("\noptions:")[2]
    flags = set()
    for line in section.splitlines():
        invocation = re.match(r"^  (-\S.*?)(?:\s{2,}|$)", line)
        if invocation:
            flags.update(name.split()[0] for name in invocation.group(1).split(", ") if name.startswith("--"))
    return flags - HELP_FLAGS


def cli_commands(monkeypatch) -> dict[tuple[str, ...], set[str]]:
    """Every leaf command path (("build",), ("patches", "check")) -> the flags its --help lists."""
    commands = {}
    for name in listed_choices(help_text((), monkeypatch)):
        text = help_text((name,), monkeypatch)
        subcommands = listed_choices(text)
        for path in [(name, sub) for sub in subcommands] or [(name,)]:
            commands[path] = option_flags(help_text(path, monkeypatch) if subcommands else text)
    return commands


def table_rows(readme: str) -> list[list[str]]:
    """The cells of each row of the commands table, `\\|` read as a bar."""
    section = readme.partition("\n## Commands\n")[2]
    assert section, "README.md has no '## Commands' section"
    section = section.split("\n## ", 1)[0]
    lines = section.splitlines()
    header = next((i for i, line in enumerate(lines)
                   if [cell.strip().lower() for cell in cells(line)] == ["command", "what it does"]), None)
    assert header is not None, "no `| command | what it does |` table under '## Commands'"
    rows = []
    for line in lines[header + 2:]:  # after the header and its `| --- | --- |` line
        if not line.lstrip().startswith("|"):
            break
        rows.append(cells(line))
    return rows


def cells(line: str) -> list[str]:
    inner = line.strip()
    if not inner.startswith("|"):
        return []
    return [cell.replace("\\|", "|").strip() for cell in CELL_BORDER.split(inner.strip("|"))]


def row_commands(first_cell: str, commands: dict[tuple[str, ...], set[str]]) -> tuple[list[tuple[str, ...]], list[str]]:
    """The command paths a row's first cell names, and the code spans that name no command."""
    paths, unknown = [], []
    for span in CODE_SPAN.findall(first_cell):
        words = span.split()
        if words and words[0] == "builder":
            words = words[1:]
        leaves = [path for path in commands if words and path[0] == words[0]]
        if not leaves:
            unknown.append(span)
            continue
        named = [path for path in leaves if len(path) == 1 or path[1] in words[1:]]
        paths.extend(named or leaves)  # a command with subcommands, none named: all of them
    return paths, unknown


def row_flags(row: list[str]) -> set[str]:
    spans = CODE_SPAN.findall(row[0])
    spans += [span for cell in row[1:] for span in CODE_SPAN.findall(cell) if span.startswith("--")]
    return {flag for span in spans for flag in FLAG.findall(span)}


def table_problems(readme: str, commands: dict[tuple[str, ...], set[str]]) -> list[str]:
    problems = []
    named: dict[tuple[str, ...], set[str]] = {path: set() for path in commands}
    covered = set()
    for row in table_rows(readme):
        paths, unknown = row_commands(row[0], commands)
        label = row[0]
        problems += [f"{label}: `{span}` is no builder command" for span in unknown]
        if not paths:
            continue
        flags = row_flags(row)
        known = set().union(*(commands[path] for path in paths))
        names = ", ".join(" ".join(path) for path in paths)
        problems += [f"{label}: {flag} is not in the --help of {names}" for flag in sorted(flags - known)]
        for path in paths:
            named[path] |= flags
            covered.add(path)
    for path, flags in commands.items():
        name = " ".join(path)
        if path not in covered:
            problems.append(f"builder {name} has no row in the table")
        else:
            problems += [f"builder {name}: {flag} (in its --help) is in none of its rows"
                         for flag in sorted(flags - named[path])]
    return problems


def test_the_commands_table_matches_every_commands_help(monkeypatch):
    assert table_problems(README.read_text(), cli_commands(monkeypatch)) == []


# The comparison itself, on a table made for it (so a table that is right today cannot hide a
# comparison that checks nothing).
COMMANDS = {("build",): {"--stack", "--load", "--engine"}, ("patches", "check"): {"--stack"},
            ("patches", "refresh"): {"--from"}, ("pin",): set()}
TABLE = """\
# Title

## Commands

| command | what it does |
| --- | --- |
| `builder build [--stack S] [--offline]` | builds; `--load` also loads it (unlike `docker run --gpus`) |
| `builder patches check \\| refresh [--stack S] [--from V]` | patch series |
| `builder smoke IMAGE` | checks |

## Next
| command | what it does |
"""


def test_the_comparison_names_each_false_or_missing_row():
    assert table_problems(TABLE, COMMANDS) == [
        "`builder build [--stack S] [--offline]`: --offline is not in the --help of build",
        "`builder smoke IMAGE`: `builder smoke IMAGE` is no builder command",
        "builder build: --engine (in its --help) is in none of its rows",
        "builder pin has no row in the table",
    ]


def test_the_cli_side_reads_commands_subcommands_and_flags(monkeypatch):
    commands = cli_commands(monkeypatch)
    assert {"--stack", "--engine", "--no-cache", "--load", "--offline", "--resmoke"} <= commands[("build",)]
    assert ("patches", "check") in commands and ("patches", "refresh") in commands
    assert commands[("patches", "refresh")] >= {"--package", "--from", "--to"}
    assert "--help" not in commands[("matrix",)]
