"""End to end on a real engine: the CUDA 13 stack (the README's default row, every wheel from the default
index) built on the local base, smoke-gated, tagged, reproducible, and its faults caught from inside real images.

These build multi-gigabyte images: minutes each. They run in CI (`scripts/test`), in file order.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import docker
import pytest

from builder.cache import wheel_cache
from builder.config.matrix import load_matrix
from builder.engine import get_engine
from builder.engine.buildah import BuildahEngine
from builder.engine.protocol import BuildRequest
from builder.lock import store
from builder.paths import RUNTIME_UID
from builder.render import render
from builder.smoke import smoke_gate
from checkouts import BUILT_ROW, BUILT_STACK, clone_checkout, run_builder

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
MATRIX = load_matrix(REPO / "matrix.toml")
STACK = MATRIX.stack(BUILT_STACK)


def builder(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_builder(*args, env=env)


def test_verify_finds_two_clean_builds_of_a_small_real_stack_identical(local_base, builder_env, tmp_path):
    """Every mechanism of the stack's Dockerfile (venv, hash-checked install with no index from a
    read-only mount of the locked wheel, a patch layer applied and byte-compiled, the in-image tools)
    on the real wheel the stack's last patch changes, twice from empty storage. The full 11 GB stack takes
    the same path (`builder verify STACK`) but needs about 60 GB of free disk for its two private
    storages, more than CI has here."""
    resolution = store.entry(STACK.name, REPO / "matrix.lock").resolution
    patch = render.rendered_patches(STACK, MATRIX.project.patches)[-1]
    patched = resolution.distribution(patch.distribution)
    shutil.copy(REPO / patch.source, tmp_path / patch.name)
    shutil.copy(REPO / "builder/runtime/apply_patch.py", tmp_path / "apply_patch.py")
    shutil.copytree(REPO / "builder/runtime", tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "requirements.txt").write_text(
        f"{patched.name}=={patched.version} --hash=sha256:{patched.sha256}\n")
    locked = wheel_cache.locked_wheels(dataclasses.replace(resolution, distributions=(patched,)))
    cache = wheel_cache.WheelCache()
    cache.fill(locked, STACK.python, STACK.name)
    cache.link_into(locked, tmp_path / "wheels")
    site = f"/opt/venv/lib/python{STACK.python}/site-packages"
    (tmp_path / "Dockerfile").write_text(f"""FROM {local_base}
ARG SOURCE_DATE_EPOCH
RUN ["{STACK.base.venv_python}", "-m", "venv", "/opt/venv"]
COPY requirements.txt /opt/builder/requirements/requirements.txt
RUN --mount=type=bind,source=wheels,target=/run/wheels,ro \\
    ["/opt/venv/bin/pip", "install", "--no-index", "--find-links", "/run/wheels", "--no-deps", "--require-hashes", "-r", "/opt/builder/requirements/requirements.txt"]
COPY apply_patch.py /opt/builder/apply_patch.py
COPY {patch.name} /opt/builder/patches/{patch.name}
RUN ["/opt/venv/bin/python", "/opt/builder/apply_patch.py", "--site-packages", "{site}", "/opt/builder/patches/{patch.name}"]
COPY runtime/ /opt/builder/runtime/
""")
    result = builder("verify", "--dockerfile", str(tmp_path / "Dockerfile"), "--context", str(tmp_path), env=builder_env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.startswith("identical: sha256:")


def test_verify_names_the_layer_of_a_planted_date(local_base, builder_env, tmp_path):
    (tmp_path / "Dockerfile").write_text(
        f"FROM {local_base}\nRUN [\"/bin/sh\", \"-c\", \"echo stable > /stable\"]\n"
        "RUN [\"/bin/sh\", \"-c\", \"date +%s%N > /built-at\"]\n")
    result = builder("verify", "--dockerfile", str(tmp_path / "Dockerfile"), "--context", str(tmp_path), env=builder_env)
    assert result.returncode == 1
    assert "first differing layer: #3" in result.stdout and "date +%s%N" in result.stdout
    assert "built-at" in result.stdout and "/stable" not in result.stdout.split("first differing layer")[1]


def test_build_tags_only_after_smoke_passes(built, lock_copy):
    result, report = built
    assert report["smoke"]["passed"] is True
    immutable, moving = report["tags"]
    moving_name = "sglang:" + STACK.name.removeprefix("sglang-")  # sglang:0.5.23-cu130-local
    assert immutable.startswith(f"{moving_name}-") and moving == moving_name
    client = docker.from_env()
    image = client.images.get(immutable)
    assert image.id == report["image_id"] == client.images.get(moving).id
    assert not [t for t in image.tags if "candidate" in t]
    outcome = store.entry(STACK.name, lock_copy).outcome
    assert outcome.status == "smoke-passed" and outcome.image.image_id == report["image_id"]
    assert (REPO / outcome.image.sbom).is_file()


def test_labels_record_pins_patches_and_time_and_nothing_from_the_clone(built):
    _, report = built
    labels = docker.from_env().images.get(report["image_id"]).labels
    assert labels["org.opencontainers.image.created"] == "2026-01-01T00:00:00Z"
    assert json.loads(labels["dev.sglang-builder.pins"])["torch"] == STACK.package("torch").version
    patches = json.loads(labels["dev.sglang-builder.patches"])
    assert [p["sha256"] for p in patches] == [p.sha256 for p in render.rendered_patches(STACK, MATRIX.project.patches)]
    # The commit, the remote and the host go to the provenance record, never into the image.
    assert not {"org.opencontainers.image.revision", "org.opencontainers.image.source"} & set(labels)


def test_report_has_each_layer_and_patch_layer_sizes(built):
    _, report = built
    assert len(report["patch_layers"]) == len(render.rendered_patches(STACK, MATRIX.project.patches)) == 2
    assert all(layer["bytes"] > 0 for layer in report["patch_layers"])
    steps = [layer["step"] for layer in report["layers"]]
    torch_layer = next(i for i, s in enumerate(steps) if "torch.plan.json" in s and "install_wheels.py" in s)
    first_patch = next(i for i, s in enumerate(steps) if "apply_patch.py" in s and "--site-packages" in s)
    tools = max(i for i, s in enumerate(steps) if "builder/runtime/" in s)  # the FlashInfer bake copies some earlier
    assert torch_layer < first_patch < tools


def test_no_op_rebuild_after_the_test_suite_reuses_every_layer_and_keeps_the_image_id(built, builder_env, tmp_path):
    """By now the suite has imported builder.runtime here, leaving __pycache__ beside the in-image tools;
    one is planted too, in case this test runs alone. Neither reaches the context, so every step comes
    from the cache and the immutable tag keeps naming the same image; no container runs, so no podman
    service is started either (a podman on PATH before the real one logs every call)."""
    _, report = built
    planted = REPO / "builder/runtime/__pycache__"
    planted.mkdir(exist_ok=True)
    (planted / "planted-by-test.cpython-311.pyc").write_bytes(b"\x00not an input")
    calls = tmp_path / "podman-calls"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "podman").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {shutil.which("podman")} "$@"\n')
    (tmp_path / "bin" / "podman").chmod(0o755)
    try:
        again = builder("build", "--local-base", "--stack", BUILT_ROW,
                        env={**builder_env, "PATH": f"{tmp_path / 'bin'}:{builder_env.get('PATH', os.environ['PATH'])}"})
    finally:
        (planted / "planted-by-test.cpython-311.pyc").unlink()
    assert again.returncode == 0, again.stderr[-4000:]
    assert not calls.exists()
    layers = len(report["layers"]) - 1  # every layer above the base
    assert f"layer cache: {layers} of {layers} layers reused" in again.stderr
    assert not re.search(r"\] layer \d+: ", again.stderr)  # none written
    # The same image id: nothing is downloaded or copied, and the lock's smoke pass for it stands.
    assert f"smoke checks passed before for {report['image_id']} (matrix.lock); --resmoke runs them" in again.stderr
    assert "wheels downloaded: 0 bytes; delivered to Docker: 0 bytes)" in again.stderr
    second = json.loads((REPO / "build-reports" / f"{STACK.name}.json").read_text())
    assert second["image_id"] == report["image_id"]
    assert second["smoke"] == report["smoke"]
    assert docker.from_env().images.get(report["tags"][0]).id == report["image_id"]


def test_the_run_that_answered_each_check_is_committed_for_a_clone(built, tmp_path):
    """`--resmoke` ran every check; the file written beside the report answers each of them for this very
    image on a host that kept nothing, with the results the report holds."""
    from builder.paths import layer_listings_dir
    from builder.runtime.smoke.program import CHECKS
    from builder.smoke import keyed_results
    from builder.smoke.image_files import ImageFiles

    _, report = built
    committed = keyed_results.committed_path(REPO / "build-reports", STACK.name)
    engine = BuildahEngine(export_to_docker=False)
    files = ImageFiles(engine.layer_tars(report["image_id"]), layer_listings_dir())
    settings = keyed_results.settings_identity(engine.inspect(report["image_id"]).config)
    clone_host = keyed_results.KeyedResults(tmp_path / "nothing-kept", committed)
    answered = []
    for check in CHECKS:
        record = clone_host.reusable(check, files, settings)
        assert record is not None and record["image"] == report["image_id"], check
        answered += [[r.check, r.status] for r in keyed_results.results_of(record)]
    assert answered == [[row["check"], row["status"]] for row in report["smoke"]["results"]]


def test_a_default_build_needs_no_docker_daemon_and_smoke_tests_where_buildah_built(built, tmp_path):
    """No second copy: with no Docker daemon to reach, a build whose change a smoke check reads passes,
    podman running that check (and compile, which reads the whole image) on the root the builder stacks
    from the layout's layers; the image is tagged by the layout's refs, and no container is left."""
    _, report = built
    checkout = clone_checkout(tmp_path / "changed")
    check_module = checkout / "builder/runtime/smoke/gpu_collectives.py"  # read by the gpu check alone
    check_module.write_text(check_module.read_text() + "# a smoke check's module changed\n")
    env = {key: value for key, value in os.environ.items() if key != "BUILDER_LOCK"} | {
        "CI": "true", "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}
    engine, made = BuildahEngine(export_to_docker=False), []
    try:
        again = run_builder("build", "--local-base", "--stack", BUILT_ROW, env=env, cwd=checkout)
        assert again.returncode == 0, again.stderr[-4000:]
        new_id = again.stdout.split()[-1]
        made.append(store.entry(STACK.name, checkout / "matrix.lock").outcome.image.immutable_tag)
        assert new_id != report["image_id"]
        assert "delivered to Docker: 0 bytes)" in again.stderr
        assert "run: compile, gpu" in again.stderr
        rebuilt = json.loads((checkout / "build-reports" / f"{STACK.name}.json").read_text())
        assert rebuilt["smoke"]["passed"] is True
        assert engine.image_id(rebuilt["tags"][0]) == new_id
    finally:
        # The moving tag back on the image the other tests check; the changed image goes.
        engine.tag(report["image_id"], report["tags"][1])
        for name in made:
            engine.remove(name)
    listed = subprocess.run(["podman", "ps", "--all", "--filter", "label=dev.sglang-builder.owner", "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    assert json.loads(listed or "[]") == []


def _bench_in_image(image_id: str, tmp_path: Path, tok_s: str) -> tuple[int, str, dict]:
    """`IMAGE bench`: the entrypoint launches the stand-in server (8 GPUs as its nvidia-smi reports),
    waits for ready, benchmarks it and compares with the pinned figure."""
    model, cache = tmp_path / "model", tmp_path / "cache"
    model.mkdir()
    cache.mkdir()
    os.chown(cache, RUNTIME_UID, RUNTIME_UID)  # as docs/entrypoint.md tells a host: the image's user writes it
    (model / "config.json").write_text("{}")
    standin = REPO / "tests" / "standin_sglang"
    container = docker.from_env().containers.run(
        image_id,
        ["bench", "--mode", "baseline", "--model", "/models/M", "--host", "127.0.0.1",
         "--output", "/cache/bench.json", "--repetitions", "2", "--output-len", "32", "--reference", "89.5"],
        environment={"PYTHONPATH": "/standin:/opt", "STANDIN_SHARDS": "4", "STANDIN_TOK_S": tok_s,
                     "PATH": "/standin/bin:/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        volumes={str(standin): {"bind": "/standin", "mode": "ro"},
                 str(model): {"bind": "/models/M", "mode": "ro"}, str(cache): {"bind": "/cache", "mode": "rw"}},
        detach=True,
    )
    try:
        status = container.wait(timeout=300)["StatusCode"]
        logs = container.logs().decode()
    finally:
        container.remove(force=True)
    return status, logs, json.loads((cache / "bench.json").read_text())


def test_entrypoint_benchmarks_the_standin_inside_the_image(built, tmp_path):
    _, report = built
    status, logs, bench = _bench_in_image(report["image_id"], tmp_path, "89.5")
    assert status == 0, logs[-3000:]
    assert "The server is fired up and ready to roll!" in logs
    assert bench["reference_tok_s"] == 89.5 and bench["verdict"] != "regression"


def test_entrypoint_flags_a_slower_decode_inside_the_image(built, tmp_path):
    _, report = built
    status, logs, _ = _bench_in_image(report["image_id"], tmp_path, "83.9")
    assert status == 1, logs[-3000:]
    assert "regression" in logs.lower()


def test_smoke_command_inside_the_image(built):
    _, report = built
    container_output = docker.from_env().containers.run(
        report["image_id"], ["smoke", "--json"], remove=True, stdout=True, stderr=False).decode()
    results = json.loads(container_output)
    assert results["ok"] is True and results["summary"]["fail"] == 0
    assert results["stack"] == STACK.name


def _derived(base_tag: str, tmp_path: Path, name: str, steps: str) -> str:
    """A real image FROM the built one with one planted fault. Docker's engine builds it: the base is
    already in the daemon, where the smoke checks run, so nothing has to be copied there."""
    from builder.engine import host_network

    # The fault is planted as root (the venv and the tools are root's); the image then runs as its own user again.
    (tmp_path / "Dockerfile").write_text(f"FROM {base_tag}\nUSER root\n{steps}\nUSER {RUNTIME_UID}:{RUNTIME_UID}\n")
    network = host_network.host_network()
    result = get_engine("docker").build(BuildRequest(
        context_dir=tmp_path, dockerfile=tmp_path / "Dockerfile", tags=(f"localhost/fault-{name}:test",),
        source_date_epoch=STACK.source_date_epoch, add_hosts=network.add_hosts, secrets=network.secrets))
    return result.image_id


SITE = f"/opt/venv/lib/python{STACK.python}/site-packages"
SYMM_MEM_PATCH = render.rendered_patches(STACK, MATRIX.project.patches)[0]  # sglang 0001, torch symmetric memory
FAULTS = {
    # NVRTC for CUDA 13, which every sgl_kernel library needs (torch's nvidia-cuda-nvrtc wheel installs it).
    "removed-library": (f"RUN rm {SITE}/nvidia/cu13/lib/libnvrtc.so.13", "abi.needed-libs.sglang-kernel"),
    "reverted-patch": (f"RUN patch -R -p1 -d {SITE} -i {SYMM_MEM_PATCH.target}",
                       f"patches.{SYMM_MEM_PATCH.distribution}/{SYMM_MEM_PATCH.name}"),
    # The assembler nvcc runs to make sm_120 cubins: the compile check must really compile, not find nvcc.
    "compiler-without-ptxas": (f"RUN rm {SITE}/nvidia/cu13/bin/ptxas", "compile.nvcc"),
    "absent-architecture": ("RUN [\"/opt/venv/bin/python\", \"-c\", \"import json; p='/opt/builder/stack.json'; "
                            "d=json.load(open(p)); d['target_arch']=['11.0']; json.dump(d, open(p, 'w'))\"]",
                            "arch.sgl-kernel"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_planted_fault_is_caught_by_its_check(built, tmp_path, fault):
    _, report = built
    steps, check = FAULTS[fault]
    image = _derived(report["tags"][1], tmp_path, fault, steps)
    # Only the check's own group (the program's --only): the whole program passed on the built image.
    result = smoke_gate.run_in_image(image, only=[check.split(".")[0]])
    docker.from_env().images.remove(image, force=True)
    assert not result.passed
    assert check in result.failures(), result.table()


def test_extension_against_another_torch_is_caught(built, tmp_path):
    """sglang-kernel 0.4.10 is built against torch 2.14; an image whose torch is 2.13.0 (a CUDA 13 build
    too, so every library the kernels need is found) must fail on the symbols they import."""
    _, report = built
    # The image's venv has no pip (the builder installs its wheels): the derived image adds it first.
    steps = ('RUN ["/opt/venv/bin/python", "-m", "ensurepip"]\n'
             'RUN --mount=type=secret,id=cacert ["/opt/venv/bin/python", "-m", "pip", "install", "--cert", '
             '"/run/secrets/cacert", "--no-deps", "torch==2.13.0"]')
    image = _derived(report["tags"][1], tmp_path, "torch", steps)
    result = smoke_gate.run_in_image(image, only=["versions", "abi"])
    docker.from_env().images.remove(image, force=True)
    assert {"versions.torch", "abi.undefined-symbols.sglang-kernel"} <= set(result.failures()), result.table()
