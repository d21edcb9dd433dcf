"""Each value escaped for the place it lands in a rendered file: a Dockerfile's exec-form JSON
argument, LABEL value or comment, a bare Dockerfile word (FROM, COPY, EXPOSE), a pip requirement
line, a YAML key. The matrix's grammar (builder/config/grammar.py) refuses bad values first; this is
the second layer, so a value the grammar missed still cannot start a line, an instruction or an
interpolation. A value that has no escaped form where it lands is refused (UserError).

Benign values come out byte for byte as written: escaping changes only what would have injected.
"""

from __future__ import annotations

import json
import re
import unicodedata

from jinja2.utils import htmlsafe_json_dumps

from builder.errors import UserError, one_line

# Safe unquoted: what a bare Dockerfile word, a requirement token or a plain YAML key may hold.
_BARE = re.compile(r"[A-Za-z0-9._+@/:=%,~-]+")
_YAML_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def _plain_line(text: str) -> bool:
    """One printable line: nothing that ends a line or hides (controls, format characters, separators)."""
    return all(unicodedata.category(char) not in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") for char in text)


def exec_arg(value) -> str:
    """One element of an exec-form JSON array (RUN ["..."]): a JSON string, ASCII only."""
    return json.dumps(str(value))


def label(value) -> str:
    """A LABEL value: a double-quoted JSON string (ASCII, with jinja's HTML-safe escapes the committed
    files already use), with '$' escaped so the engine does not substitute a variable."""
    return str(htmlsafe_json_dumps(str(value))).replace("$", "\\$")


def comment(value) -> str:
    """Text inside a '#' comment line: as written when it is one printable line, else as a JSON string."""
    text = str(value)
    return text if _plain_line(text) else json.dumps(text)


def bare(value) -> str:
    """A word that cannot be quoted where it lands (FROM, COPY, EXPOSE, a requirement line): refused
    unless it is made of safe characters only."""
    text = str(value)
    if not _BARE.fullmatch(text):
        raise UserError(f"'{one_line(text)}' cannot be written into a rendered file as a plain word "
                        "(letters, digits and . _ + @ / : = % , ~ - only)")
    return text


def port(value) -> str:
    """A TCP port number as written in EXPOSE, a health check or a published port."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise UserError(f"port {one_line(repr(value))} is not an integer from 1 to 65535")
    return str(value)


def yaml_key(value) -> str:
    """A YAML mapping key: plain when it is a simple name, else a double-quoted scalar."""
    text = str(value)
    return text if _YAML_KEY.fullmatch(text) else json.dumps(text)


FILTERS = {"exec_arg": exec_arg, "label": label, "comment": comment, "bare": bare, "port": port,
           "yaml_key": yaml_key}
