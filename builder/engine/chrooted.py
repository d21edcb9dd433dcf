"""Run a command from another root filesystem (engine_root.py's), seeing the host's files where they are:

    python -m builder.engine.chrooted ROOT COMMAND [ARG...]

In a private mount namespace (unshare), ROOT is bind-mounted onto itself (runc's pivot_root needs / to
be a mount point), /proc, /sys and /dev and the host directories builds use (temporary directories,
home directories, the current directory, and BUILDER_CHROOT_SHARE's colon-separated list) are bound
into it at the same paths, then the command runs chrooted there. Nothing leaks into the host's mounts.
Used as a command prefix: BUILDER_BUILDAH="python -m builder.engine.chrooted ROOT buildah".

Each such command has a namespace of its own, so what it mounts (`buildah mount`) is gone when it ends.
A build that reads a container's files through the engine's mount holds one namespace instead
(held_namespace): a process parked in it, every command entered into it with nsenter, and the mounted
files read through that process's root (/proc/PID/root), as the kernel shows them to it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from builder.errors import BuildFailure

_MARKER = "BUILDER_CHROOTED_NAMESPACE"
_KERNEL = ("/proc", "/sys", "/dev")
_SHARED = ("/tmp", "/var/tmp", "/root", "/home")
_PR_SET_PDEATHSIG = 1
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def shared_directories(cwd: Path, extra: str) -> list[Path]:
    """Host directories to bind, outermost first, without one that another already covers."""
    candidates = [Path(p) for p in _SHARED] + [cwd] + [Path(p) for p in extra.split(":") if p]
    chosen: list[Path] = []
    for path in sorted({p.resolve() for p in candidates if p.is_absolute() and p.is_dir()}, key=lambda p: len(p.parts)):
        if path != Path("/") and not any(path.is_relative_to(outer) for outer in chosen):
            chosen.append(path)
    return chosen


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, stdin=subprocess.DEVNULL)


def _enter(root: Path, command: list[str]) -> None:
    cwd = Path.cwd()
    _mount("--bind", str(root), str(root))
    for directory in _KERNEL:
        _mount("--rbind", directory, str(root / directory.lstrip("/")))
    for directory in shared_directories(cwd, os.environ.get("BUILDER_CHROOT_SHARE", "")):
        target = root / directory.relative_to("/")
        target.mkdir(parents=True, exist_ok=True)
        _mount("--rbind", str(directory), str(target))
    os.chroot(root)
    os.chdir(cwd if cwd.is_dir() else "/")
    os.environ.pop(_MARKER, None)
    os.environ["PATH"] = _PATH
    os.execvp(command[0], command)


def chrooted_root(prefix: Sequence[str]) -> Path | None:
    """The root a command prefix runs its command from, when it is this module's prefix."""
    if len(prefix) >= 5 and list(prefix[1:3]) == ["-m", __name__]:
        return Path(prefix[3])
    return None


@contextlib.contextmanager
def held_namespace(prefix: Sequence[str], cwd: Path) -> Iterator[tuple[list[str], Callable[[str], Path]]]:
    """For the block: (a prefix running the same command inside one held namespace, in `cwd`, and a
    function from a path there to where this process reads it). A prefix of no chroot is given back as
    it is. Commands entered run in the holder's working directory, `cwd` as the chroot shows it: a
    directory opened outside would be unreachable from the chroot's root, and buildah resolves
    relative paths through it."""
    root = chrooted_root(prefix)
    if root is None:
        yield list(prefix), Path
        return
    holder = subprocess.Popen([*prefix[:4], "sleep", "infinity"], stdin=subprocess.DEVNULL, cwd=cwd,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    try:
        _wait_until_chrooted(holder, root.resolve())
        entered = ["nsenter", f"--target={holder.pid}", "--mount", "--root", "--wd", "--", *prefix[4:]]
        seen_from_here = Path(f"/proc/{holder.pid}/root")
        yield entered, lambda inside: seen_from_here / str(inside).lstrip("/")
    finally:
        holder.kill()
        holder.wait()


def _die_with_parent() -> None:
    """The holder goes when the build does, even a killed one (the signal outlives exec)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _wait_until_chrooted(holder: subprocess.Popen, root: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if holder.poll() is not None:
            detail = (holder.stderr.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise BuildFailure(f"the chroot of {root} ended before it was held: {detail}")
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{holder.pid}/root") == str(root) and \
                    Path(f"/proc/{holder.pid}/comm").read_text().strip() == "sleep":
                return
        time.sleep(0.05)
    raise BuildFailure(f"the chroot of {root} was not held within {timeout_s:.0f} s")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m builder.engine.chrooted ROOT COMMAND [ARG...]", file=sys.stderr)
        return 2
    root, command = Path(argv[0]).resolve(), argv[1:]
    if not (root / "usr" / "bin").is_dir():
        print(f"chrooted: error: {root} is not a root filesystem (no usr/bin)", file=sys.stderr)
        return 2
    if os.environ.get(_MARKER) != str(root):
        package_parent = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, _MARKER: str(root),
               "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
        os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m",
                               "builder.engine.chrooted", str(root), *command], env)
    _enter(root, command)
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
