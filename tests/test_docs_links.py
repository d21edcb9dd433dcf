"""Every relative link in README.md and docs/ points at a file or folder that exists, and every
#anchor at a heading of the file it names (as GitHub derives heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text outside code: links in code blocks and spans are not links."""
    return _FENCE.sub("", text)


def links(text: str) -> list[str]:
    return _LINK.findall(_CODE.sub("", _prose(text)))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_prose(page.read_text())):
        base = anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not relative
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{target}: no heading #{fragment} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# A `--flag` heading, with words\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a---flag-heading-with-words) [gone](missing.md) "
                    "[bad](other.md#nowhere) `[code](missing-too.md)`\n"
                    "```\n[fenced](missing-three.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#nowhere: no heading #nowhere in other.md"]


def test_the_readme_links_each_docs_page():
    """Each topic page under docs/ is reachable from the README's front door."""
    linked = {(REPO / target.partition("#")[0]).resolve() for target in links((REPO / "README.md").read_text())}
    pages = {page.resolve() for page in (REPO / "docs").glob("*.md")}
    assert sorted(str(p.relative_to(REPO)) for p in pages - linked) == []
