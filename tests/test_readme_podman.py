"""The README's `podman run` line starts a container on this host: its --ulimit values are within what
podman may give (the hard limits, and for processes the kernel's pid_max, to which podman lowers its
own). Podman's defaults (nofile 1048576), or nproc at `ulimit -Hu` where that is above pid_max, end in
runc's "error setting rlimit type 7 / 6: operation not permitted" before the image's program runs.

The line runs as the README gives it (through bash, for its `$(...)`), on a one-file image in place
of the stack's: the limits are set when the container starts, whatever the image.
"""

from __future__ import annotations

import re
import resource
import subprocess
from pathlib import Path

import pytest

from builder.runtime.binaries.elf import ElfFile

pytestmark = pytest.mark.engine

README = Path(__file__).resolve().parent.parent / "README.md"
PODMAN_LINE = re.compile(r"^podman run (?P<options>.+?) (?P<image>\S+) shell(?:\s|$)", re.MULTILINE)
STATIC_PROGRAM = "/sbin/ldconfig"  # glibc's, linked statically: it runs in an image holding nothing else
TAG = "localhost/builder-test-podman-line:1"


def readme_podman_options() -> str:
    lines = PODMAN_LINE.findall(README.read_text())
    assert len(lines) == 1, f"README.md should hold one `podman run ... IMAGE shell` line, holds {len(lines)}"
    return lines[0][0]


@pytest.fixture(scope="module")
def one_file_image():
    with ElfFile(STATIC_PROGRAM) as elf:
        if elf.needed:
            pytest.skip(f"{STATIC_PROGRAM} is linked dynamically here")
    container = subprocess.run(["buildah", "from", "scratch"], capture_output=True, text=True,
                               check=True).stdout.strip()
    try:
        subprocess.run(["buildah", "copy", container, STATIC_PROGRAM, "/program"], check=True, capture_output=True)
        subprocess.run(["buildah", "config", "--entrypoint", '["/program"]', container], check=True,
                       capture_output=True)
        subprocess.run(["buildah", "commit", "--quiet", container, TAG], check=True, capture_output=True)
    finally:
        subprocess.run(["buildah", "rm", container], check=False, capture_output=True)
    yield TAG
    subprocess.run(["buildah", "rmi", "--force", TAG], check=False, capture_output=True)


def podman_run(options: str, image: str) -> subprocess.CompletedProcess:
    # The README's words as a user's shell reads them; `--version`: ldconfig prints and exits 0.
    return subprocess.run(["bash", "-c", f"podman run {options} {image} --version"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


def test_the_readmes_podman_line_starts_a_container(one_file_image):
    result = podman_run(readme_podman_options(), one_file_image)
    assert result.returncode == 0, result.stderr
    assert "ldconfig" in result.stdout


def test_nproc_above_pid_max_is_what_fails(one_file_image):
    """The check can fail: the line the README had (nofile only) does, where the hard process limit is
    above pid_max, as on the hosts this was found on."""
    hard_nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    if hard_nproc != resource.RLIM_INFINITY and hard_nproc <= pid_max:
        pytest.skip(f"the hard process limit ({hard_nproc}) is within pid_max ({pid_max}) here")
    if may_raise_limits():
        pytest.skip("this host's root may raise limits (CAP_SYS_RESOURCE): podman's defaults start here")
    result = podman_run("--rm --ulimit nofile=$(ulimit -Hn)", one_file_image)
    assert result.returncode != 0
    assert "error setting rlimit type 6" in result.stderr


def may_raise_limits() -> bool:
    status = Path("/proc/self/status").read_text()
    effective = int(re.search(r"^CapEff:\s*([0-9a-f]+)$", status, re.MULTILINE).group(1), 16)
    return bool(effective & (1 << CAP_SYS_RESOURCE))


CAP_SYS_RESOURCE = 24  # linux/capability.h
