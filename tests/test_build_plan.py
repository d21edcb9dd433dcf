"""What `builder build` decides before and after the engine runs: the network a row gets (none), when the
lock's smoke pass stands for an image, and the one-line refusals of --offline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from builder.build_stack import build
from builder.cache.deb_cache import DebCache
from builder.config.matrix import load_matrix
from builder.config.stack import AptSpec
from builder.engine.progress import Progress
from builder.errors import UserError
from builder.lock import store
from builder.lock.model import SmokeRecord
from checkouts import REPO, run_builder
from lock_values import smoke_report, system_packages_of

MATRIX = load_matrix(REPO / "matrix.toml")
LOCAL = MATRIX.select(["sglang-0.5.9-cu128"], local_base=True)[0]
REGISTRY_ROW = MATRIX.stack("sglang-0.5.9-cu128")
IMAGE_ID = "sha256:" + "c" * 64
PASSED, FAILED = smoke_report(image=IMAGE_ID), smoke_report(False, image=IMAGE_ID)


@pytest.mark.parametrize("row", [LOCAL, REGISTRY_ROW], ids=["local", "registry"])
def test_every_row_builds_with_no_network_and_no_host_entries(tmp_path, row):
    """A registry row's system packages come from the lock's .debs too: no step needs a network."""
    request = build.build_request(row, tmp_path, tmp_path / "Dockerfile", "candidate", False, Progress.for_environment())
    assert request.network == "none" and request.add_hosts == () and dict(request.secrets) == {}


@pytest.mark.parametrize("smoke, expected", [
    ({"image_id": IMAGE_ID, "passed": True, "report": PASSED.to_dict()}, PASSED),
    ({"image_id": "sha256:" + "d" * 64, "passed": True, "report": PASSED.to_dict()}, None),  # another image
    ({"image_id": IMAGE_ID, "passed": False, "report": FAILED.to_dict()}, None),  # it failed
    ({"image_id": IMAGE_ID, "passed": True, "report": None}, None),  # no report to reuse
    (None, None),
])
def test_the_lock_smoke_pass_stands_only_for_the_same_image(smoke, expected):
    found = store.entry("sglang-0.5.9-cu128-local", REPO / "matrix.lock")
    recorded = found.with_outcome(smoke=SmokeRecord.from_dict(smoke) if smoke else None)
    assert build.recorded_smoke(recorded, IMAGE_ID) == expected


def test_offline_with_an_empty_deb_cache_is_one_line_naming_what_is_missing(tmp_path):
    resolution = store.entry("sglang-0.5.9-cu128-local", REPO / "matrix.lock").resolution
    added = system_packages_of(AptSpec("ubuntu", "noble", ("patch", "python3.12"), "added"))
    with pytest.raises(UserError) as failure:
        build.fetch_debs(REGISTRY_ROW, dataclasses.replace(resolution, system_packages=added), DebCache(tmp_path), True,
                         Progress.for_environment())
    assert str(failure.value) == (f"sglang-0.5.9-cu128: offline, and the .deb cache {tmp_path} lacks 2 of 2 locked "
                                  f"packages (patch=1.0, python3.12=1.0): run `builder fetch` where the archive is "
                                  f"reachable and bring the cache")


@pytest.mark.engine
def test_offline_with_an_empty_wheel_cache_is_one_line_naming_what_is_missing(local_base, builder_env, tmp_path):
    before = Path(builder_env["BUILDER_LOCK"]).read_bytes()
    result = run_builder("build", "--offline", "--local-base", "--stack", "sglang-0.5.9-cu128",
                         env={**builder_env, "BUILDER_CACHE": str(tmp_path / "empty")})
    assert result.returncode == 2
    message = result.stderr.splitlines()[-1]
    assert message.startswith(f"builder: error: sglang-0.5.9-cu128-local: offline, and the wheel cache "
                              f"{tmp_path / 'empty' / 'locked-wheels'} lacks 169 of 169 locked wheels (aiohappyeyeballs==")
    assert message.endswith(", ...): run `builder fetch` where the indexes are reachable and bring the cache")
    assert Path(builder_env["BUILDER_LOCK"]).read_bytes() == before  # nothing recorded, nothing built
