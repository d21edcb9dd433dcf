"""What `builder build` decides before and after the engine runs: the network a row gets, when the
lock's smoke pass stands for an image, and the one-line refusals of --offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.config.matrix import load_matrix
from builder.engine.progress import Progress
from builder.errors import UserError
from builder.image import build, wheel_cache
from builder.lock import store
from builder.lock.model import SmokeRecord
from support import REPO, run_builder

MATRIX = load_matrix(REPO / "matrix.toml")
LOCAL = MATRIX.select(["sglang-0.5.9-cu128"], local_base=True)[0]
REGISTRY_ROW = MATRIX.stack("sglang-0.5.9-cu128")
IMAGE_ID = "sha256:" + "c" * 64


def test_a_local_row_builds_with_no_network_and_no_host_entries(tmp_path):
    request = build.build_request(LOCAL, tmp_path, tmp_path / "Dockerfile", "candidate", False, Progress.for_environment())
    assert request.network == "none" and request.add_hosts == () and dict(request.secrets) == {}


def test_a_registry_row_keeps_the_network_its_apt_step_needs(tmp_path):
    request = build.build_request(REGISTRY_ROW, tmp_path, tmp_path / "Dockerfile", "candidate", False,
                                  Progress.for_environment())
    assert request.network is None


@pytest.mark.parametrize("smoke, expected", [
    ({"image_id": IMAGE_ID, "passed": True, "report": {"passed": True}}, {"passed": True}),
    ({"image_id": "sha256:" + "d" * 64, "passed": True, "report": {"passed": True}}, None),  # another image
    ({"image_id": IMAGE_ID, "passed": False, "report": {"passed": False}}, None),  # it failed
    ({"image_id": IMAGE_ID, "passed": True, "report": "reports/smoke.json"}, None),  # no report to reuse
    (None, None),
])
def test_the_lock_smoke_pass_stands_only_for_the_same_image(smoke, expected):
    found = store.entry("sglang-0.5.9-cu128", REPO / "matrix.lock")
    recorded = found.with_outcome(smoke=SmokeRecord.from_dict(smoke) if smoke else None)
    assert build.recorded_smoke(recorded, IMAGE_ID) == expected


def test_offline_refuses_a_row_whose_apt_step_needs_the_network(tmp_path):
    resolution = store.entry("sglang-0.5.9-cu128", REPO / "matrix.lock").resolution
    with pytest.raises(UserError) as failure:
        build.fetch_wheels(REGISTRY_ROW, resolution, wheel_cache.WheelCache(tmp_path), True, Progress.for_environment())
    assert str(failure.value) == ("sglang-0.5.9-cu128: --offline cannot build on nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04: "
                                  "its apt step needs the network; build the --local-base row")


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
