"""Fixtures shared by several test modules: lock records, and the real CUDA 13 stack (the README's
default row) built once per session on the local base (the end-to-end modules all test that one image).
That build starts with its lane's first test, in the background, and the modules that use it run last
in that lane (tests/background_build.py says why); `scripts/test` runs the two lanes side by side."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import uuid

import docker
import pytest
from builder.engine import engine_root

from builder.base.local_base import BaseSpec, make_base
from builder.cache.deb_cache import DebCache
from builder.config.matrix import load_matrix
from builder.engine import get_engine
from builder.engine.buildah import BuildahEngine
from builder.files import locked
from builder.lock import records
from builder.lock.model import ImageRecord, LockedBase
from builder.lock.resolution import lock_stacks
from background_build import BackgroundBuild
from engine_helpers import BASE_EPOCH, TEST_BASE_TAG
from checkouts import BUILT_ROW, BUILT_STACK, REPO, builder_command, run_builder
from lock_values import (base_digest_of, locked_base_packages, locked_base_sources, locked_base_spec, resolution_of,
                         smoke_report, system_packages_of)
from registries import registry_image


@pytest.fixture
def record_image():
    """Record an image in a lock as `builder build` does after its smoke checks pass."""

    def record(stack, image_id, tags, path=None, inputs_hash="f" * 64):
        base = LockedBase(stack.base.name, stack.base.image, stack.base.local)
        image = ImageRecord(image_id=image_id, immutable_tag=tags[0], tags=tuple(tags), inputs_hash=inputs_hash,
                            base=base, source_date_epoch=1767225600, report="r.json", provenance="r.provenance.json")
        records.record_build(stack.name, image, smoke_report(image=image_id, stack=stack.name), path)

    return record


@pytest.fixture(scope="session")
def lock_copy(tmp_path_factory):
    """Builds in the checkout record into a scratch copy of matrix.lock, never the committed one."""
    path = tmp_path_factory.mktemp("lock") / "matrix.lock"
    shutil.copy(REPO / "matrix.lock", path)
    return path


@pytest.fixture(scope="session")
def builder_env(lock_copy):
    return {**os.environ, "BUILDER_LOCK": str(lock_copy), "CI": "true"}


# The README's main job in this checkout. With --resmoke: the committed lock holds a pass for this image
# id, and CI must see the gate run, not its record. With --load: the tests that follow run the image in
# the Docker daemon, as a GPU host does.
BUILT_ARGS = ["build", "--local-base", "--stack", BUILT_ROW, "--resmoke", "--load"]
USES_BUILT = pytest.StashKey[bool]()
# The two lanes `scripts/test` runs side by side (pytest-xdist, --dist loadgroup, one worker each): the
# modules that use the host's engines, and all others with the real stack's build beside them and its
# modules last. Each lane is one work unit, so a worker runs its lane in order, alone.
ENGINE_LANE, BUILD_LANE = "engines", "build"
_ENGINE_FIXTURES = {"client", "image", "base_image", "trixie_buildah", "local_base", "docker_services"}


def lane_of(module_items) -> str:
    """The build's lane for a module whose tests use `built` (or use neither the engines nor their
    fixtures); the engines' lane for every other: those share the daemon's and buildah's names."""
    fixtures = {name for item in module_items for name in getattr(item, "fixturenames", ())}
    if "built" in fixtures:
        return BUILD_LANE
    engine = any(item.get_closest_marker("engine") for item in module_items)
    return ENGINE_LANE if engine or fixtures & _ENGINE_FIXTURES else BUILD_LANE


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Each module's tests go to its lane as an xdist group (a no-op without xdist)."""
    by_module: dict = {}
    for item in items:
        by_module.setdefault(item.path, []).append(item)
    for module_items in by_module.values():
        lane = lane_of(module_items)
        for item in module_items:
            item.add_marker(pytest.mark.xdist_group(lane))


class _BuiltModulesLast:
    @pytest.hookimpl(trylast=True)  # after -m and -k have deselected: only a test that runs starts the build
    def pytest_collection_modifyitems(self, config, items):
        """The modules that use `built` run after all others of their lane, each in its own order, so
        that the build has the rest of the lane beside it."""
        modules = {item.path for item in items if "built" in getattr(item, "fixturenames", ())}
        items.sort(key=lambda item: item.path in modules)  # stable: every other order stays
        config.stash[USES_BUILT] = bool(modules)


def pytest_configure(config):
    config.pluginmanager.register(_BuiltModulesLast(), "built-modules-last")


def make_local_base(env: dict) -> str:
    """The mmdebstrap base the stack builds FROM, made by `builder base` when missing. Both lanes may
    ask at once: a lock file makes the second wait for the first's base instead of making its own."""
    image = load_matrix(REPO / "matrix.toml").stack(BUILT_STACK).base.image
    (REPO / "build").mkdir(exist_ok=True)  # gitignored: a fresh clone has none
    with locked(REPO / "build" / "test-base.lock"):
        if not get_engine("buildah").exists(image):
            result = run_builder("base", env=env)
            assert result.returncode == 0, result.stderr
    return image


class BuildLane:
    """The real stack's build for this session: started once, by the first test of the build's lane
    (without xdist, the first test), so that it runs beside that lane's other tests."""

    def __init__(self, env: dict):
        self._env = env
        self._build: BackgroundBuild | None = None

    def start(self) -> BackgroundBuild:
        if self._build is None:
            self._build = BackgroundBuild(lambda: make_local_base(self._env), builder_command(*BUILT_ARGS),
                                          self._env, REPO)
        return self._build

    def base(self) -> str:
        return self._build.base.result() if self._build else make_local_base(self._env)

    def stop(self) -> None:
        if self._build is not None:
            self._build.stop()


@pytest.fixture(scope="session")
def build_lane(builder_env):
    lane = BuildLane(builder_env)
    yield lane
    lane.stop()


@pytest.fixture(autouse=True)
def start_the_build_with_its_lane(request):
    """Where a selected test uses `built`, the first test of the build's lane starts the build."""
    if not request.config.stash.get(USES_BUILT, False):
        return
    in_lane = request.node.get_closest_marker("xdist_group").args[0] == BUILD_LANE
    if in_lane or not _under_xdist(request.config):
        request.getfixturevalue("build_lane").start()


def _under_xdist(config) -> bool:
    return getattr(config, "workerinput", None) is not None


@pytest.fixture(scope="session")
def local_base(build_lane):
    return build_lane.base()


@pytest.fixture(scope="session")
def built(build_lane):  # its build waits for the base itself
    """(the README's main job's result, its build report), from the build the session started."""
    result = build_lane.start().build.result()
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((REPO / "build-reports" / f"{BUILT_STACK}.json").read_text())
    return result, report


@pytest.fixture(scope="session")
def client():
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as error:
        pytest.fail(f"Docker daemon not running ({error}); scripts/setup-host starts it")
    return client


@pytest.fixture
def image(client):
    """A one-file image made with `docker import`: unique content, so a unique image id."""
    repository = f"builder-test-{uuid.uuid4().hex[:8]}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        payload = f"{repository}\n".encode()
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime = len(payload), 1767225600
        archive.addfile(info, io.BytesIO(payload))
    result = client.api.import_image_from_data(buffer.getvalue(), repository=repository, tag="candidate")
    image_id = client.images.get(f"{repository}:candidate").id
    assert json.loads(result.splitlines()[-1] if isinstance(result, str) else result)["status"] == image_id
    yield {"id": image_id, "repository": repository, "immutable": f"{repository}:0.5.9-cu128-abc123"}
    for tagged in client.images.list(all=True):
        if tagged.id == image_id:
            client.images.remove(image_id, force=True)


@pytest.fixture(scope="session")
def base_image(tmp_path_factory):
    """The real mmdebstrap base for the engine tests, in buildah's storage and the Docker daemon, made
    once per session (its own date, so its id differs from the base real builds use)."""
    output = tmp_path_factory.mktemp("base")
    engine = BuildahEngine()
    # The .debs come from apt's mirror first, as `builder base` fetches them: the snapshot archive is
    # only the fallback for versions the mirror no longer serves.
    result = make_base(locked_base_spec(source_date_epoch=BASE_EPOCH, tag=TEST_BASE_TAG), output, locked_base_packages(),
                       DebCache(), engine=engine, sources=locked_base_sources())
    engine.daemon.load(result.archive)
    return result


@pytest.fixture(scope="session")
def trixie_buildah() -> list[str]:
    """Debian trixie's buildah, from a root cached under /var/tmp/engine (apt's default mirror)."""
    return engine_root.buildah_prefix(engine_root.make_root())


@pytest.fixture
def cu128_lock(tmp_path, monkeypatch):
    """A lock (BUILDER_LOCK) whose sglang-0.5.9-cu128 entry is resolved, for the registry tests."""
    lock_path = tmp_path / "matrix.lock"
    monkeypatch.setenv("BUILDER_LOCK", str(lock_path))
    lock_stacks([load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")], path=lock_path,
                     resolver=resolution_of, base_resolver=base_digest_of, apt_resolver=system_packages_of)
    return lock_path


@pytest.fixture
def record_cu128(record_image):
    """Record a test image ({"id", "immutable"}) as the cu128 row's smoke-passed build in a lock."""
    stack = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")
    return lambda path, image: record_image(stack, image["id"], [image["immutable"]], path)


@pytest.fixture(scope="module")
def docker_setup() -> list[str]:
    """pytest-docker's `up` for every compose-run service here: detached, never building an image."""
    return ["up --detach"]


@pytest.fixture(scope="module")
def compose_down_guard(docker_compose_command, docker_compose_file, docker_compose_project_name):
    """Request it before docker_services: pytest-docker cleans up only after a successful `up`, and a
    service that failed to start would stay behind with its network. This runs `down` after it anyway."""
    yield
    files = [docker_compose_file] if isinstance(docker_compose_file, str) else docker_compose_file
    subprocess.run([*shlex.split(docker_compose_command), *[word for path in files for word in ("-f", path)],
                    "-p", docker_compose_project_name, "down", "--volumes", "--timeout", "30"],
                   capture_output=True, check=False)


@pytest.fixture(scope="session")
def registry_container_image(client):
    """Debian's docker-registry as an image for tests/compose/registry*.yaml; removed after the session."""
    tag = registry_image(client)
    yield tag
    client.images.remove(tag)
