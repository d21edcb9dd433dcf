"""Errors a user can cause: printed as one line, never as a traceback."""

import unicodedata

# Characters str.splitlines() breaks at, besides the control characters.
_LINE_BREAKS = {"\u0085", "\u2028", "\u2029"}


def one_line(text: str) -> str:
    """`text` with every line break and control character escaped, so a value quoted from a user's
    file cannot split the line it is reported on."""
    return "".join(
        char.encode("unicode_escape").decode("ascii")
        if char in _LINE_BREAKS or unicodedata.category(char) == "Cc" else char
        for char in text
    )


class UserError(Exception):
    """Bad input (matrix, arguments, missing tool): exit status 2."""

    exit_code = 2


class BuildFailure(Exception):
    """A build, patch or test step failed: exit status 1."""

    exit_code = 1
