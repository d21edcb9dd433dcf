"""Lock schema 2 and the migration from schema 1: a schema-1 file is read as schema 2, left alone by
commands that only read, and rewritten in schema 2, losing nothing, by the first command that writes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from builder.lock import records, store
from builder.lock.model import LockedBase
from checkouts import run_builder
from lock_values import smoke_report

REPO = Path(__file__).resolve().parent.parent
SCHEMA_1 = REPO / "tests" / "data" / "matrix.schema1.lock"
LOCAL = "sglang-0.5.9-cu128-local"


@pytest.fixture
def old_lock(tmp_path):
    path = tmp_path / "matrix.lock"
    shutil.copy(SCHEMA_1, path)
    return path


def test_a_schema_1_lock_reads_with_each_digest_named_for_what_it_is(old_lock):
    old = json.loads(SCHEMA_1.read_text())["stacks"]
    lock = store.read(old_lock)
    assert lock.schema_read == 1
    local = lock.require(LOCAL)
    assert local.resolution.base == LockedBase("debian-bookworm", "localhost/builder-base:debian-bookworm", True,
                                               image_id=old[LOCAL]["base"]["digest"])
    image = local.outcome.image
    assert image.image_id == old[LOCAL]["image"]["id"]
    assert image.manifest_digest is None  # schema 1's image.digest: never pushed
    assert image.base.image_id == old[LOCAL]["image"]["base_digest"]
    assert local.outcome.smoke_passed and local.outcome.status == "smoke-passed"
    registry = lock.require("sglang-0.5.9-cu128")
    assert registry.resolution.base.manifest_digest is None and registry.resolution.base.image_id is None
    for name, item in old.items():
        migrated = lock.require(name).resolution
        assert {d.name: d.to_dict() for d in migrated.distributions} == item["distributions"]
        assert migrated.pins_hash == item["pins_hash"]


def test_reading_commands_leave_a_schema_1_file_alone(old_lock):
    before = old_lock.read_bytes()
    result = run_builder("lock", "--check", env={**os.environ, "BUILDER_LOCK": str(old_lock), "CI": "true"})
    assert "not a schema" not in result.stderr and "unsupported lock schema" not in result.stderr
    assert old_lock.read_bytes() == before


def test_the_first_write_rewrites_it_as_schema_2_losing_nothing(old_lock):
    migrated = store.read(old_lock)
    records.record_smoke(LOCAL, smoke_report(image="sha256:" + "9" * 64, stack=LOCAL), image_id="sha256:" + "9" * 64,
                         path=old_lock)
    data = json.loads(old_lock.read_text())
    assert data["schema"] == 2
    rewritten = store.read(old_lock)
    assert rewritten.schema_read == 2
    for name, found in migrated.stacks.items():
        now = rewritten.require(name)
        assert now.resolution == found.resolution
        assert now.outcome.image == found.outcome.image
    assert rewritten.require(LOCAL).outcome.rejected_candidate.image_id == "sha256:" + "9" * 64
    # Schema 2 reads back to the same bytes.
    assert store.dumps(rewritten) == old_lock.read_text()


def test_a_lock_from_a_newer_builder_is_refused_in_one_line(tmp_path):
    path = tmp_path / "matrix.lock"
    path.write_text('{"schema": 3, "stacks": {}}\n')
    result = run_builder("lock", "--check", env={**os.environ, "BUILDER_LOCK": str(path), "CI": "true"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"builder: error: {path}: unsupported lock schema 3 (this builder reads 1 and 2)"]
