"""Run a command from another root filesystem (engine_root.py's), seeing the host's files where they are:

    python -m builder.engine.chrooted ROOT COMMAND [ARG...]

In a private mount namespace (unshare), ROOT is bind-mounted onto itself (runc's pivot_root needs / to
be a mount point), /proc, /sys and /dev and the host directories builds use (temporary directories,
home directories, the current directory, and BUILDER_CHROOT_SHARE's colon-separated list) are bound
into it at the same paths, then the command runs chrooted there. Nothing leaks into the host's mounts.
Used as a command prefix: BUILDER_BUILDAH="python -m builder.engine.chrooted ROOT buildah".

Each such command has a namespace of its own, so what it mounts is gone when it ends (the write-once
build mounts nothing through the engine: it stacks the layers itself).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_MARKER = "BUILDER_CHROOTED_NAMESPACE"
_KERNEL = ("/proc", "/sys", "/dev")
_SHARED = ("/tmp", "/var/tmp", "/root", "/home")
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
