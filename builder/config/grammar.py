"""The grammar of every matrix value that reaches a rendered file, a path, a command line or a URL.

`check(document)` returns every value (and free key) outside its field's grammar as (key path,
message), after the schema has checked the types; the loader turns the path into a file:line. The
renderer escapes each value for where it lands as well (builder/escape.py), so a gap here alone
cannot inject anything.

A message never quotes a URL (it may hold a secret) and quotes other values escaped (one_line).
"""

from __future__ import annotations

import math
import re
import unicodedata
from urllib.parse import urlsplit

from builder.errors import one_line
from builder.net.loopback import is_loopback_name

# A name usable as a tag, a directory and a compose service: rows, bases, the local base.
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
# A Python distribution name (PEP 508).
PACKAGE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")
# A version's characters (the loader parses it as PEP 440 too): no whitespace, which PEP 440 would strip.
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
# A Debian package name (Debian Policy 5.6.1); a distribution or suite name.
DEB_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]{1,99}")
ARCHIVE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
# An image reference: [host[:port]/]path[:tag][@sha256:hex] (the distribution project's grammar).
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?))*(?::[0-9]{1,5})?"
REPOSITORY = re.compile(rf"{_PATH_PART}(?:/{_PATH_PART})*")
IMAGE = re.compile(rf"(?:{_HOST}/)?{_PATH_PART}(?:/{_PATH_PART})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                   r"(?:@sha256:[0-9a-f]{64})?")
# An absolute path inside the image: no '.', '..', empty parts, spaces or shell and YAML specials.
IN_IMAGE_PATH = re.compile(r"(?:/[A-Za-z0-9_+@-][A-Za-z0-9._+@-]{0,127}){1,16}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
ARG_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
# A URL's characters (RFC 3986), less the quotes, backslash, '$' and '`' nothing here needs.
_URL_CHARS = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+")
_TEXT_REFUSED = set('"\\`$')
TEXT_MAX = 500
PORT_RANGE = (1, 65535)
LENGTH_RANGE = (1, 1 << 20)
PROMPTS_RANGE = (1, 100_000)


def _matches(pattern: re.Pattern, what: str):
    def rule(value):
        if isinstance(value, str) and not pattern.fullmatch(value):
            return f"{what} '{one_line(value)}' is not {_DESCRIPTIONS[pattern]}"
        return None
    return rule


_DESCRIPTIONS = {
    NAME: "a name (at most 100 of: lowercase letters, digits, '.', '_', '-', a letter or digit first)",
    PACKAGE: "a distribution name (letters, digits, '.', '_', '-')",
    VERSION: "a version (letters, digits, '.', '+', '!', '_', '-'; no spaces)",
    DEB_PACKAGE: "a Debian package name (lowercase letters, digits, '+', '.', '-')",
    ARCHIVE_NAME: "an archive name (lowercase letters, digits, '.', '_', '-')",
    REPOSITORY: "a repository path (lowercase path parts joined by '/')",
    IMAGE: "an image reference ([HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST])",
    IN_IMAGE_PATH: "an absolute path in the image (parts of letters, digits, '.', '_', '+', '@', '-'; no '..')",
    ENV_NAME: "an environment variable name (letters, digits, '_', not a digit first)",
    ARG_NAME: "a server argument name (lowercase letters, digits, '_')",
}


def text_problem(value: str) -> str | None:
    """Why `value` is not one printable line of text, or None."""
    if len(value) > TEXT_MAX:
        return f"is longer than {TEXT_MAX} characters"
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            return f"holds {one_line(repr(char))}, which is not printable on one line"
        if char in _TEXT_REFUSED:
            return f"holds {char!r} (refused in text: '\"', '\\', '`', '$')"
    return None


def _text(what: str):
    def rule(value):
        if isinstance(value, str) and (problem := text_problem(value)):
            return f"{what} {problem}"
        return None
    return rule


def url_problem(url: str, allow_template: bool = False, signed_archive: bool = False) -> str | None:
    """Why `url` is not a source URL: https, or plain http to loopback only (by parsed host), with no
    user or password. Never quotes the URL. A `signed_archive` (an apt archive: its signed InRelease
    names every file's sha256, and apt's own defaults are plain http) may be plain http anywhere."""
    probe = url.replace("{archive}", "a").replace("{timestamp}", "t") if allow_template else url
    if not _URL_CHARS.fullmatch(probe):
        return "is not a URL (printable ASCII with no spaces, quotes, backslash, '$' or '`')"
    try:
        parts = urlsplit(probe)
        host, _ = parts.hostname, parts.port
    except ValueError:
        return "is not a URL (its host or port does not parse)"
    if "@" in parts.netloc:
        return ("carries a user name or password, refused (credentials come from a netrc or the Docker "
                "config, never from the matrix)")
    if parts.scheme not in ("https", "http"):
        return f"has scheme '{one_line(parts.scheme)}' (sources are https://; http only to loopback)"
    if not host:
        return "names no host"
    if parts.scheme == "http":
        return None if signed_archive or is_loopback_name(host) else \
            "is plain http to a host that is not loopback (sources are https://; http only to 127.0.0.0/8, ::1, localhost)"
    return None


def _url(what: str, allow_template: bool = False, signed_archive: bool = False):
    def rule(value):
        if isinstance(value, str) and value and (problem := url_problem(value, allow_template, signed_archive)):
            return f"{what} {problem}"
        return None
    return rule


def _apt_source(value):
    if not isinstance(value, str):
        return None
    if problem := text_problem(value):
        return f"apt source line {problem}"
    words = value.split()
    if not words or words[0] != "deb":
        return "apt source line must read 'deb URI SUITE COMPONENT...'"
    for word in words:
        if "://" in word and (problem := url_problem(word, signed_archive=True)):
            return f"apt source URI {problem}"
    return None


def _number(what: str, low, high, integer: bool):
    def rule(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None if not integer else f"{what} must be an integer from {low} to {high}"
        if integer and not isinstance(value, int):
            return f"{what} must be an integer from {low} to {high}, not {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{what} must be a finite number, not {value!r}"
        if not low <= value <= high:
            return f"{what} {value!r} is out of range ({low} to {high})"
        return None
    return rule


def _tolerance(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or not 0 <= value < 1:
        return f"regression_tolerance must be a finite fraction from 0 up to 1, not {value!r}"
    return None


def _one_of(what: str, choices: tuple[str, ...]):
    def rule(value):
        if isinstance(value, str) and value not in choices:
            return f"{what} '{one_line(value)}' must be one of {', '.join(choices)}"
        return None
    return rule


def _arg_value(value):
    """A server argument's value: finite numbers, one printable line of text, or a list of those."""
    if isinstance(value, list):
        return next((problem for item in value if (problem := _arg_value(item))), None)
    if isinstance(value, float) and not math.isfinite(value):
        return f"server argument must be a finite number, not {value!r}"
    if isinstance(value, str) and (problem := text_problem(value)):
        return f"server argument {problem}"
    return None


_port = _number("port", *PORT_RANGE, integer=True)
_env_value = _text("environment value")

# Patterns of key paths below a [[stack]] table (and below an axis value, which sets the same fields):
# '*' is any key, '#' any array index.
_STACK_VALUES = {
    ("description",): _text("description"),
    ("replaces",): _matches(NAME, "replaces"),
    ("base",): _matches(NAME, "base"),
    ("base_source",): _one_of("base_source", ("registry", "local")),
    ("patched", "#"): _matches(PACKAGE, "patched"),
    ("jit_device_code", "*"): _text("jit_device_code reason"),
    ("packages", "*", "version"): _matches(VERSION, "version"),
    ("packages", "*", "index"): _url("index"),
    ("packages", "*", "url"): _url("url"),
    ("overrides", "#", "package"): _matches(PACKAGE, "package"),
    ("overrides", "#", "declared_by"): _matches(PACKAGE, "declared_by"),
    ("overrides", "#", "reason"): _text("reason"),
    ("serve", "cache_dir"): _matches(IN_IMAGE_PATH, "cache_dir"),
    ("serve", "env", "*"): _env_value,
    ("serve", "modes", "*", "args", "port"): _port,
    ("serve", "modes", "*", "args", "*"): _arg_value,
    ("serve", "modes", "*", "reasons", "*"): _text("reason"),
    ("serve", "modes", "*", "env", "*"): _env_value,
    ("bench", "input_len"): _number("input_len", *LENGTH_RANGE, integer=True),
    ("bench", "output_len"): _number("output_len", *LENGTH_RANGE, integer=True),
    ("bench", "num_prompts"): _number("num_prompts", *PROMPTS_RANGE, integer=True),
    ("bench", "regression_tolerance"): _tolerance,
}
_STACK_KEYS = {
    ("jit_device_code",): _matches(PACKAGE, "jit_device_code key"),
    ("packages",): _matches(PACKAGE, "package"),
    ("serve", "env"): _matches(ENV_NAME, "environment variable"),
    ("serve", "modes", "*", "env"): _matches(ENV_NAME, "environment variable"),
    ("serve", "modes", "*", "args"): _matches(ARG_NAME, "server argument"),
    ("serve", "modes", "*", "reasons"): _matches(ARG_NAME, "server argument"),
}
_APT_VALUES = {
    ("distribution",): _matches(ARCHIVE_NAME, "distribution"),
    ("suite",): _matches(ARCHIVE_NAME, "suite"),
    ("sources", "#"): _apt_source,
    ("keyring",): _text("keyring"),
    ("snapshot",): _url("snapshot", allow_template=True, signed_archive=True),
}
_VALUES = {
    ("defaults", "repository"): _matches(REPOSITORY, "repository"),
    ("defaults", "source_url"): _url("source_url"),
    ("defaults", "base_source"): _one_of("base_source", ("registry", "local")),
    ("bases", "*", "image"): _matches(IMAGE, "image"),
    ("bases", "*", "venv_python"): _matches(IN_IMAGE_PATH, "venv_python"),
    ("bases", "*", "system_packages", "#"): _matches(DEB_PACKAGE, "system package"),
    **{("bases", "*") + key: rule for key, rule in _APT_VALUES.items()},
    ("local_base", "name"): _matches(NAME, "local_base name"),
    ("local_base", "venv_python"): _matches(IN_IMAGE_PATH, "venv_python"),
    ("local_base", "packages", "#"): _matches(DEB_PACKAGE, "package"),
    **{("local_base",) + key: rule for key, rule in _APT_VALUES.items()},
    **{("stack", "#") + key: rule for key, rule in _STACK_VALUES.items()},
    **{("stack", "#", "axes", "*", "*") + key: rule for key, rule in _STACK_VALUES.items()},
}
_KEYS = {
    ("bases",): _matches(NAME, "base"),
    **{("stack", "#") + key: rule for key, rule in _STACK_KEYS.items()},
    **{("stack", "#", "axes", "*", "*") + key: rule for key, rule in _STACK_KEYS.items()},
}


def _fits(pattern: tuple, path: tuple) -> bool:
    return len(pattern) == len(path) and all(
        want == got or want == "*" and isinstance(got, str) or want == "#" and isinstance(got, int)
        for want, got in zip(pattern, path))


def _first(table: dict, path: tuple):
    """The rule of the first pattern that fits: the specific one before a '*' (args.port before args.*)."""
    return next((rule for pattern, rule in table.items() if _fits(pattern, path)), None)


def check(value, path: tuple = ()) -> list[tuple[tuple, str]]:
    """Every value and free key outside its grammar, as (key path, message)."""
    problems = []
    rule = _first(_VALUES, path)
    if rule is not None and not isinstance(value, dict) and (message := rule(value)):
        return [(path, message)]
    if isinstance(value, dict):
        key_rule = _first(_KEYS, path)
        for key, item in value.items():
            if key_rule is not None and (message := key_rule(key)):
                problems.append((path + (key,), message))
                continue
            problems += check(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems += check(item, path + (index,))
    return problems
