"""The server's API key comes from a file or SERVE_API_KEY, never from a command line, and no message,
log line or child command line shows it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from builder.runtime.serve import api_key
from builder.runtime.serve.errors import UsageError
from checkouts import REPO


def test_a_key_file_is_read_and_handed_on_by_name(tmp_path):
    path = tmp_path / "key"
    path.write_text("k-1234\n")
    key = api_key.read(str(path), {})
    assert key.value == "k-1234" and key.file == str(path)
    assert key.child_env({"SERVE_API_KEY": "stale", "PATH": "/bin"}) == {"PATH": "/bin", "SERVE_API_KEY_FILE": str(path)}
    assert api_key.read(None, {"SERVE_API_KEY_FILE": str(path)}) == key
    assert "k-1234" not in repr(key)


def test_the_variable_is_the_other_source_and_empty_means_none():
    key = api_key.read(None, {"SERVE_API_KEY": "k-9"})
    assert key.value == "k-9" and key.file is None
    assert key.child_env({}) == {"SERVE_API_KEY": "k-9"}
    assert api_key.read(None, {"SERVE_API_KEY": ""}) is None  # compose passes an unset host variable as ""
    assert api_key.read(None, {}) is None


@pytest.mark.parametrize(
    ("content", "environ", "message"),
    [
        ("", {}, "is empty"),
        ("two words\n", {}, "one word of printable characters"),
        ("k\x07ey", {}, "one word of printable characters"),
        ("k-1", {"SERVE_API_KEY": "k-2"}, "a file or SERVE_API_KEY, not both"),
    ],
)
def test_bad_keys_are_one_line_that_never_shows_them(tmp_path, content, environ, message):
    path = tmp_path / "key"
    path.write_text(content)
    with pytest.raises(UsageError, match=message) as caught:
        api_key.read(str(path), environ)
    assert content.strip() not in str(caught.value) or not content.strip()


def test_a_missing_key_file_is_named():
    with pytest.raises(UsageError, match=r"cannot read the API key file /nowhere/key: No such file"):
        api_key.read("/nowhere/key", {})


def test_redact_hides_the_key_as_written_and_as_repr_writes_it():
    key = api_key.ApiKey("it's", None)
    line = f"server_args=ServerArgs(api_key={key.value!r}) and it's"
    assert key.redact(line) == "server_args=ServerArgs(api_key=\"***\") and ***"


def test_take_removes_both_variables():
    environ = {"SERVE_API_KEY": "k-5", "OTHER": "1"}
    assert api_key.take(environ) == "k-5" and environ == {"OTHER": "1"}


def test_keyed_launch_adds_the_key_only_inside_the_server_process(tmp_path):
    """The launcher runs sglang.launch_server (here a stand-in module on the path) with --api-key in its
    sys.argv, while its command line, as /proc shows it, holds no key."""
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(
        "import os, sys\n"
        "cmdline = open('/proc/self/cmdline', 'rb').read().decode()\n"
        "print(sys.argv[1:], 'k-77' in cmdline, 'SERVE_API_KEY' in os.environ)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "builder.runtime.serve.keyed_launch", "--port", "1"],
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", "SERVE_API_KEY": "k-77"}, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['--port', '1', '--api-key', 'k-77'] False False"
