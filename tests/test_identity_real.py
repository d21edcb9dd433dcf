"""One image per inputs, on the real CUDA 13 stack (the README's default row): a fresh clone builds the image the committed lock
records, clones at other paths with other remotes and stray files build the same one, and an immutable
tag never moves. (`builder verify --against-lock` is tested on a small locked row in test_loopback_lock:
on this stack it is one more 9-minute build from empty storage, which a cold CI run's first build is.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import docker
import pytest

from builder.engine.buildah import BuildahEngine
from builder.lock import store
from checkouts import BUILT_ROW, BUILT_STACK as STACK, REPO, run_builder

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.slow]



def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def committed_image_id() -> str:
    committed = store.parse(git("show", "HEAD:matrix.lock", cwd=REPO), Path("HEAD:matrix.lock"))
    return committed.require(STACK).outcome.image.image_id


def clone(destination: Path, remote: str) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(destination)], check=True)
    git("remote", "set-url", "origin", remote, cwd=destination)
    return destination


def test_this_clone_builds_the_image_the_committed_lock_records(built):
    """CI runs on a fresh clone: its build must be the committed record, or the lock is stale."""
    _, report = built
    assert report["image_id"] == committed_image_id()
    # The smoke checks ran again (--resmoke) and are recorded under the id, not this run's candidate tag.
    assert report["smoke"]["image"] == report["image_id"]


def test_the_committed_lock_describes_the_tree():
    result = run_builder("lock", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{STACK}" not in result.stderr


def test_clones_at_other_paths_with_other_remotes_and_stray_files_build_one_image(built, tmp_path):
    _, report = built
    first = clone(tmp_path / "a" / "first", "https://user:secret@example.invalid/team/sglang-image-builder.git")
    second = clone(tmp_path / "b" / "deeper" / "second", "git@example.invalid:team/sglang-image-builder.git")
    cache = second / "builder/runtime/__pycache__"
    cache.mkdir()
    (cache / "entrypoint.cpython-311.pyc").write_bytes(b"\x00stale byte code from another interpreter")
    (second / "builder/runtime/notes.txt").write_text("an untracked file beside the in-image tools\n")
    (second / "patches/sglang/0.5.23/0099-draft.patch").write_text("an untracked patch draft\n")
    env = {key: value for key, value in os.environ.items() if key != "BUILDER_LOCK"} | {"CI": "true"}
    ids = []
    for checkout in (first, second):
        result = run_builder("build", "--local-base", "--stack", BUILT_ROW, env=env, cwd=checkout)
        assert result.returncode == 0, result.stderr[-4000:]
        ids.append(result.stdout.split()[-1])
        # The build's outputs that belong in git are the committed ones, byte for byte.
        assert git("status", "--porcelain", "--untracked-files=no", cwd=checkout) == ""
    assert ids == [report["image_id"], report["image_id"]]
    provenance = json.loads((first / "build-reports" / f"{STACK}.provenance.json").read_text())
    source = provenance["predicate"]["buildDefinition"]["resolvedDependencies"][0]
    assert source["uri"] == "git+https://example.invalid/team/sglang-image-builder.git"  # no credentials
    assert source["digest"]["gitCommit"] == git("rev-parse", "HEAD", cwd=first).strip()
    assert provenance["subject"][0]["digest"]["sha256"] == report["image_id"].removeprefix("sha256:")


def test_an_immutable_tag_that_names_another_image_is_refused_and_nothing_moves(built, builder_env):
    _, report = built
    immutable, moving = report["tags"]
    engine = BuildahEngine(export_to_docker=False)  # the impostor goes into buildah's storage only
    container = subprocess.run(["buildah", "from", "scratch"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["buildah", "commit", "--quiet", container, "localhost/planted:impostor"], check=True,
                   capture_output=True)
    subprocess.run(["buildah", "rm", container], check=True, capture_output=True)
    impostor = engine.image_id("localhost/planted:impostor")
    try:
        engine.tag(impostor, immutable)  # in buildah's storage and the Docker daemon
        result = run_builder("build", "--local-base", "--stack", BUILT_ROW, env=builder_env)
        assert result.returncode == 1
        error = result.stderr.strip().splitlines()[-1]
        # Both engines named: the impostor's is in no lock record; this build's is the buildah that ran.
        assert error.startswith(f"builder: error: immutable tag {immutable} already names {impostor} (made by an "
                                f"unrecorded engine) in buildah, this build made {report['image_id']} (with buildah ")
        assert "): first differing layer #1" in error
        assert engine.image_id(immutable) == impostor  # not moved back either: the build changed nothing
        assert engine.image_id(moving) == report["image_id"]
        assert docker.from_env().images.get(moving).id == report["image_id"]
    finally:
        engine.tag(report["image_id"], immutable)
        subprocess.run(["buildah", "rmi", "localhost/planted:impostor"], capture_output=True)
    assert docker.from_env().images.get(immutable).id == report["image_id"]


def test_after_a_build_whose_input_changed_the_renders_and_the_lock_are_current(built, tmp_path):
    """No second command after a build: the lock it wrote describes the new image, and images/ (compose.yaml
    included) is what `builder render` would write."""
    _, report = built
    checkout = clone(tmp_path / "changed", str(REPO))
    # serve/bench.py: read by the serve tools only, not by the FlashInfer bake, whose layer is reused, nor by
    # any smoke check: only compile runs again, which runs programs the read tracer cannot follow.
    tool = checkout / "builder/runtime/serve/bench.py"
    tool.write_text(tool.read_text() + "# an in-image tool changed\n")
    env = {key: value for key, value in os.environ.items() if key != "BUILDER_LOCK"} | {"CI": "true"}
    engine, made = BuildahEngine(), []
    try:
        result = run_builder("build", "--local-base", "--stack", BUILT_ROW, env=env, cwd=checkout)
        assert result.returncode == 0, result.stderr[-4000:]
        new_id = result.stdout.split()[-1]
        assert new_id != report["image_id"]
        assert "changed: versions, imports, abi, arch, patches, entrypoint, gpu; run: compile" in result.stderr
        # The lock check asks about the rebuilt row: every other row with an image record was built from the
        # serve/bench.py this clone changed, so it is rightly stale here.
        for command in (["render", "--check"], ["lock", "--check", "--local-base", "--stack", BUILT_ROW]):
            check = run_builder(*command, env=env, cwd=checkout)
            assert check.returncode == 0, (command, check.stdout + check.stderr)
        changed = git("status", "--porcelain", "--untracked-files=no", cwd=checkout).splitlines()
        assert sorted(line[3:] for line in changed) == sorted([
            "builder/runtime/serve/bench.py", "matrix.lock", f"build-reports/{STACK}.json",
            f"build-reports/{STACK}.cdx.json", f"build-reports/{STACK}.smoke-reads.json.gz"])
        image = store.entry(STACK, checkout / "matrix.lock").outcome.image
        made.append(image.immutable_tag)
        assert image.image_id == new_id
    finally:
        # The moving tag back on the image the other tests check; the changed image goes.
        engine.tag(report["image_id"], report["tags"][1])
        for name in made:
            engine.remove(name)
