"""A Dockerfile RUN step run by the OCI runtime (runc) on a root filesystem the builder assembled.

The write-once build (write_once.py) stacks the image's layers itself (overlay_mount.py) and runs each
step that needs the image's own programs here, with what `buildah run --network none` gives a step:
its own pid, network (loopback only), ipc, uts and mount namespaces, buildah's default capabilities,
/proc, /sys, a tmpfs /dev with the default devices, the context's read-only bind mounts, the build
arguments and the image's environment, user and working directory. What buildah itself leaves in the
root besides the step's own changes is left the same way (`engine_traces`), so the step's layer is the
engine's: the tests hold the two to each other layer by layer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from builder.engine.container_limits import runtime_rlimits
from builder.engine.ownership import process_alive
from builder.engine.process import run_streaming
from builder.errors import BuildFailure
from builder.oci import canonical

RUNTIME = "runc"
# buildah 1.28.2's default capability set for a RUN step (its bundle's process.capabilities).
_CAPABILITIES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE",
                 "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"]
_MOUNTS = [
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
     "options": ["nosuid", "noexec", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
     "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
     "options": ["nosuid", "nodev", "noexec", "mode=1777", "size=65536k"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
]
# What the builder names its runtime containers: the owner is its process id, so a later build can
# tell a dead build's container (sweep) from a live one.
_NAME_PREFIX = "builder-step-"
_NAME = re.compile(rf"^{_NAME_PREFIX}(\d+)-[0-9a-f]{{8}}$")
# cgroup v1's least cpu.shares (runc maps it onto cgroup v2's cpu.weight 1).
_LEAST_CPU_SHARES = 2


def engine_traces(root: Path) -> None:
    """What buildah leaves in the root on a RUN step besides the step's own changes: the empty files it
    binds /etc/hostname, /etc/hosts and /etc/resolv.conf onto (made once, when missing; the canonical
    layer leaves them out but keeps their directory) and a copy-up of /run, where it binds its
    /run/.containerenv (so every RUN step's layer holds `run`)."""
    engine_stubs(root)
    run = root / "run"
    if not os.path.lexists(run):
        run.mkdir(mode=0o755)
    if run.is_dir() and not run.is_symlink():
        os.chmod(run, stat.S_IMODE(os.lstat(run).st_mode))


def engine_stubs(root: Path) -> None:
    """The stub files alone, made before a step's mark on a root whose layers had a RUN step already:
    the layers leave the stubs out, and without them the next step would make them and gain `etc`."""
    etc = root / "etc"
    for stub in sorted(canonical.ENGINE_STUBS):
        path = root / stub
        if etc.is_dir() and not etc.is_symlink() and not os.path.lexists(path):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
            os.chmod(path, 0o644)


def _id_of(value: str, table: Path, what: str) -> tuple[int, int | None]:
    """A numeric id as given, or a name looked up in the image's own passwd/group file: (id, its group)."""
    if value.isdigit():
        for fields in _rows(table):
            if fields[2] == value:
                return int(value), int(fields[3]) if what == "user" and fields[3].isdigit() else None
        return int(value), None
    for fields in _rows(table):
        if fields[0] == value and fields[2].isdigit():
            return int(fields[2]), int(fields[3]) if what == "user" and fields[3].isdigit() else None
    raise BuildFailure(f"USER {value}: no such {what} in the image's /{table.parent.name}/{table.name}")


def _rows(table: Path) -> list[list[str]]:
    try:
        text = table.read_text(errors="replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines() if line.count(":") >= 3]


def process_user(root: Path, user: str | None) -> dict:
    """The runtime's user for the image's USER value ("name", "uid", "name:group", "uid:gid"), read
    from the image's own /etc/passwd and /etc/group as buildah does; root when none is set."""
    if not user:
        return {"uid": 0, "gid": 0}
    name, _, group = user.partition(":")
    uid, primary = _id_of(name, root / "etc" / "passwd", "user")
    gid = _id_of(group, root / "etc" / "group", "group")[0] if group else (primary or 0)
    return {"uid": uid, "gid": gid}


def runtime_spec(root: Path, argv: Sequence[str], env: Mapping[str, str], user: str | None, workdir: str | None,
                 binds: Sequence[tuple[Path, str]], background: bool = False) -> dict:
    """The OCI runtime spec of one step: `binds` are (host path, target in the image) mounted read-only.
    `background`: the step's own cgroup gets the least CPU weight (the runtime gives each container a
    cgroup, whose weight decides among containers whatever their processes' nice values)."""
    resources: dict = {"devices": [{"allow": False, "access": "rwm"}]}
    if background:
        resources["cpu"] = {"shares": _LEAST_CPU_SHARES}
    return {
        "ociVersion": "1.0.2",
        "process": {"user": process_user(root, user), "args": list(argv),
                    "env": [f"{key}={value}" for key, value in env.items()], "cwd": workdir or "/",
                    "capabilities": {kind: _CAPABILITIES for kind in ("bounding", "effective", "permitted")},
                    "rlimits": runtime_rlimits(), "noNewPrivileges": False},
        "root": {"path": str(root)},
        "hostname": "builder",
        "mounts": [*_MOUNTS, *({"destination": target, "type": "bind", "source": str(source),
                                "options": ["rbind", "ro", "nosuid", "nodev"]} for source, target in binds)],
        "linux": {"namespaces": [{"type": kind} for kind in ("pid", "network", "ipc", "uts", "mount")],
                  "resources": resources,
                  "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug",
                                  "/sys/firmware"],
                  "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]},
    }


class StepRunner:
    """Runs steps with runc under a state directory of the build's own (`state`), each in a container
    named after this process, removed when the step ends."""

    def __init__(self, state: Path, scratch: Path) -> None:
        self.state, self.scratch = state, scratch

    def run(self, root: Path, argv: Sequence[str], env: Mapping[str, str], user: str | None, workdir: str | None,
            binds: Sequence[tuple[Path, str]], what: str, on_line: Callable[[str], None] | None = None,
            background: bool = False) -> None:
        """`argv` in `root`; a non-zero exit is a StepFailure with the output's tail. The mount points the
        runtime made for `binds` are removed after, as `buildah build` removes those buildah run made.
        `background`: the step runs on the CPU time other steps leave (runtime_spec; nice 19 besides)."""
        made = [root / target.lstrip("/") for _, target in binds if not os.path.lexists(root / target.lstrip("/"))]
        engine_traces(root)
        name = f"{_NAME_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        bundle = self.scratch / name
        bundle.mkdir(parents=True)
        try:
            (bundle / "config.json").write_text(json.dumps(runtime_spec(root, argv, env, user, workdir, binds,
                                                                        background)))
            lowered = ["nice", "-n", "19"] if background else []
            run_streaming([*lowered, RUNTIME, "--root", str(self.state), "run", "--bundle", str(bundle), name],
                          what=what, on_line=on_line)
        finally:
            _delete(self.state, name)
            shutil.rmtree(bundle, ignore_errors=True)
            for target in made:
                with contextlib.suppress(OSError):
                    target.rmdir()

    def sweep(self) -> list[str]:
        """The containers of builds whose process is gone (a SIGKILLed build leaves its step running)."""
        swept = []
        listing = subprocess.run([RUNTIME, "--root", str(self.state), "list", "--quiet"], capture_output=True,
                                 text=True, stdin=subprocess.DEVNULL)
        for name in listing.stdout.split() if listing.returncode == 0 else ():
            found = _NAME.match(name)
            if found and not process_alive(int(found[1])):
                _delete(self.state, name)
                swept.append(name)
        return swept


def _delete(state: Path, name: str) -> None:
    subprocess.run([RUNTIME, "--root", str(state), "delete", "--force", name], capture_output=True,
                   stdin=subprocess.DEVNULL)
