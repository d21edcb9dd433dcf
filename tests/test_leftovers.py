"""A `builder` run killed with SIGKILL during its smoke checks leaves nothing behind: its watchdog removes
its smoke container and candidate tag and stops its podman service, and when the watchdog is killed too,
the next run sweeps them. What is not labelled as a dead run's own (another host's, a live run's, an
unmarked container or tag) is never touched. A small image whose smoke program hangs stands in for the stack;
it lives in private buildah storage, and its checks run through podman's API over that storage."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from builder.engine import podman_service
from builder.engine.buildah import BuildahEngine
from builder.engine.ownership import OWNER_LABEL, Owner
from builder.engine.progress import Progress
from builder.oci.layer_diff import discard_storage
from builder.smoke import smoke_host
from engine_helpers import write_context
from checkouts import REPO

pytestmark = pytest.mark.engine

HANG = "localhost/leftovers-hang:test"
CANDIDATE = "localhost/leftovers-candidate:x-0123456789ab"
# A run that "builds" the hanging image and smoke-tests it, as builder/build_stack/build.py does.
RUN = textwrap.dedent(f"""
    import sys
    from pathlib import Path
    from builder.engine.buildah import BuildahEngine
    from builder.engine.progress import Progress
    from builder.smoke import smoke_gate, smoke_host
    engine = BuildahEngine(storage_dir=Path(sys.argv[1]), export_to_docker=False)
    with smoke_host.open_host(engine, Progress.for_environment()) as host:
        candidate = {CANDIDATE!r} + host.owner.tag_suffix()
        engine.tag({HANG!r}, candidate)
        try:
            smoke_gate.run_in_image(candidate, client=host.client, labels=host.labels())
        finally:
            engine.remove(candidate)
""")


@pytest.fixture(scope="module")
def storage(base_image):
    """Private storage holding the test base and an image whose smoke program sleeps."""
    # podman takes a runroot of at most 50 characters: a short private directory, removed afterwards.
    root = Path(tempfile.mkdtemp(prefix="leftovers-", dir="/var/tmp"))
    engine = BuildahEngine(storage_dir=root / "storage", export_to_docker=False)
    engine.load(base_image.archive)
    context = write_context(root / "context", textwrap.dedent(f"""\
        FROM {base_image.tag}
        RUN ["/bin/sh", "-c", "mkdir -p /opt/venv/bin && printf '#!/bin/sh\\\\nexec sleep 600\\\\n' > /opt/venv/bin/python && chmod 755 /opt/venv/bin/python"]
        """))
    subprocess.run(engine._global_args() + ["build", "--pull=never", "--network", "none", "--quiet", "--tag", HANG,
                                            str(context)], check=True, capture_output=True)
    yield engine
    podman(engine, "rm", "--all", "--force")  # what a failing test left: buildah's own cleanup misses podman's
    discard_storage(engine, engine.storage_dir)
    shutil.rmtree(root)


def podman(engine: BuildahEngine, *args: str) -> str:
    return subprocess.run(["podman", *podman_service.storage_args(engine.storage_dir), *args], check=True,
                          capture_output=True, text=True).stdout


def containers(engine: BuildahEngine) -> dict[str, str]:
    """name -> owner label ('' when unlabelled), every container in the storage."""
    listed = json.loads(podman(engine, "ps", "--all", "--format", "json") or "[]")
    return {item["Names"][0]: (item.get("Labels") or {}).get(OWNER_LABEL, "") for item in listed}


def names(engine: BuildahEngine) -> set[str]:
    listed = json.loads(subprocess.run(engine._global_args() + ["images", "--json"], check=True,
                                       capture_output=True, text=True).stdout or "[]")
    return {name for image in listed for name in image.get("names") or ()}


def wait_for(condition, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def bystanders(storage):
    """What no sweep may touch: an unlabelled container, one a live run owns, another host's candidate
    tag, and a tag outside any candidate repository."""
    own_host = Owner.current().host
    made = {
        "unlabelled": podman(storage, "create", "--name", f"bystander-{os.getpid()}", HANG).strip(),
        "live": podman(storage, "create", "--name", f"live-{os.getpid()}", "--label",
                       f"{OWNER_LABEL}={own_host}:{os.getpid()}", HANG).strip(),
    }
    tags = [f"{CANDIDATE}.elsewhere.1", "localhost/leftovers-plain:x-0123456789ab." + own_host + ".1"]
    for tag in tags:
        storage.tag(HANG, tag)
    yield {"containers": {f"bystander-{os.getpid()}", f"live-{os.getpid()}"}, "tags": set(tags)}
    podman(storage, "rm", "--force", *made.values())
    for tag in tags:
        storage.remove(tag)


def start_run(storage: BuildahEngine) -> tuple[subprocess.Popen, str]:
    """A run in its smoke checks: returns it and the name of its smoke container."""
    run = subprocess.Popen([sys.executable, "-c", RUN, str(storage.storage_dir)], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    owner = f"{Owner.current().host}:{run.pid}"
    container = wait_for(lambda: next((name for name, label in containers(storage).items() if label == owner), None),
                         what="the run's smoke container")
    return run, container


def service_running(pid: int) -> bool:
    socket = podman_service.run_dir() / f"podman-{pid}.sock"
    return any(socket.as_posix() in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
               for p in _pids() if alive(p))


def _pids() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (entry / "cmdline").exists():
            found.append(int(entry.name))
    return found


def test_sigkill_during_smoke_leaves_nothing_and_touches_no_one_else(storage, bystanders):
    run, container = start_run(storage)
    candidate = f"{CANDIDATE}{Owner(Owner.current().host, run.pid).tag_suffix()}"
    assert candidate in names(storage) and service_running(run.pid)
    run.send_signal(signal.SIGKILL)
    run.wait()
    wait_for(lambda: container not in containers(storage) and candidate not in names(storage),
             what="the watchdog to remove the container and the candidate tag")
    wait_for(lambda: not service_running(run.pid), what="the podman service to stop")
    assert not (podman_service.run_dir() / f"podman-{run.pid}.sock").exists()
    assert bystanders["containers"] <= set(containers(storage))
    assert bystanders["tags"] <= names(storage)


def test_next_run_sweeps_what_a_dead_run_and_its_watchdog_left(storage, bystanders):
    run, container = start_run(storage)
    candidate = f"{CANDIDATE}{Owner(Owner.current().host, run.pid).tag_suffix()}"
    watchers = [pid for pid in children(run.pid) if b"builder.engine.reaper" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(watchers) == 1
    os.kill(watchers[0], signal.SIGKILL)  # a host crash takes the watchdog too
    run.send_signal(signal.SIGKILL)
    run.wait()
    time.sleep(2)
    assert container in containers(storage) and candidate in names(storage)  # left behind
    shown = io.StringIO()
    with smoke_host.open_host(storage, Progress(shown, interactive=False)) as host:
        host.ready()  # the next run that starts the container API sweeps
    assert f"container {container}" in shown.getvalue() and f"tag {candidate}" in shown.getvalue()
    assert container not in containers(storage)
    assert candidate not in names(storage)
    assert bystanders["containers"] <= set(containers(storage))
    assert bystanders["tags"] <= names(storage)
    assert HANG in names(storage)
    for pid in _pids():  # the dead run's own podman service is still up: stop it
        if alive(pid) and f"podman-{run.pid}.sock".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGTERM)
    for leftover in ("sock", "log"):
        (podman_service.run_dir() / f"podman-{run.pid}.{leftover}").unlink(missing_ok=True)
