"""The server's API key: from a file or the environment, never from a command line.

SGLang 0.5.9 takes the key only as `--api-key KEY` (ServerArgs.api_key; it reads no variable), and
a command line is readable by every process that can list this one. So the entrypoint takes the key
from `--api-key-file PATH` or SERVE_API_KEY_FILE (a file holding it, such as a container secret) or
from SERVE_API_KEY, hands the server's launcher the same file name or variable, and
builder.runtime.serve.keyed_launch adds the flag inside the server's process. SGLang logs its
ServerArgs at start, key included: the supervisor writes "***" in its place in the log and on the
terminal. The key itself is never printed.
"""

from __future__ import annotations

import dataclasses
import os

from builder.runtime.serve.errors import UsageError

KEY_VARIABLE = "SERVE_API_KEY"
FILE_VARIABLE = "SERVE_API_KEY_FILE"
HIDDEN = "***"


@dataclasses.dataclass(frozen=True)
class ApiKey:
    value: str = dataclasses.field(repr=False)
    file: str | None  # where it was read; None: it came from SERVE_API_KEY

    def child_env(self, env: dict) -> dict:
        """`env` with the key's source for the launcher (the file's name, else the variable)."""
        env = {name: value for name, value in env.items() if name not in (KEY_VARIABLE, FILE_VARIABLE)}
        if self.file:
            env[FILE_VARIABLE] = self.file
        else:
            env[KEY_VARIABLE] = self.value
        return env

    def redact(self, text: str) -> str:
        # As written, and as a Python repr writes it (SGLang logs ServerArgs' repr).
        for form in {self.value, repr(self.value)[1:-1]}:
            text = text.replace(form, HIDDEN)
        return text


def _checked(value: str, source: str) -> str:
    value = value.strip()
    if not value:
        raise UsageError(f"the API key from {source} is empty")
    if not value.isprintable() or any(c.isspace() for c in value):
        raise UsageError(f"the API key from {source} must be one word of printable characters")
    return value


def read(key_file: str | None, environ) -> ApiKey | None:
    """The key from `key_file`, SERVE_API_KEY_FILE or SERVE_API_KEY (an empty variable is unset)."""
    key_file = key_file or environ.get(FILE_VARIABLE) or None
    value = environ.get(KEY_VARIABLE) or None
    if key_file and value:
        raise UsageError(f"the API key comes from a file or {KEY_VARIABLE}, not both")
    if not key_file:
        return ApiKey(_checked(value, KEY_VARIABLE), None) if value else None
    try:
        with open(key_file, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise UsageError(f"cannot read the API key file {key_file}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"the API key file {key_file} is not UTF-8 text") from None
    return ApiKey(_checked(text, key_file), os.path.abspath(key_file))


def take(environ: dict) -> str | None:
    """The key for the launcher, removed from `environ` so SGLang's own processes do not inherit it."""
    key = read(None, environ)
    environ.pop(KEY_VARIABLE, None)
    environ.pop(FILE_VARIABLE, None)
    return key.value if key else None
