"""The smoke report the host keeps (builder/lock/smoke_report.py): the form the lock and the build report
hold, read back strictly, and a lock whose report is damaged refused in one line, losing nothing."""

from __future__ import annotations

import json

import pytest

from builder.errors import UserError
from builder.lock import store
from builder.lock.smoke_report import SmokeReport
from builder.runtime.smoke.report import Result
from checkouts import REPO

REPORT = SmokeReport("sha256:" + "a" * 64, "sglang-0.5.9-cu128-local",
                     (Result("imports.torch", "pass", "2.9.1"), Result("abi.needed-libs.torch", "fail", "libx.so"),
                      Result("gpu.driver", "skip", "no GPU")))


def test_the_recorded_form_reads_back_as_the_same_report_with_its_counts():
    data = REPORT.to_dict()
    assert data["passed"] is False and data["summary"] == {"pass": 1, "fail": 1, "skip": 1}
    again = SmokeReport.from_dict(json.loads(json.dumps(data)))
    assert again == REPORT and again.failures() == ["abi.needed-libs.torch"]
    assert "1 passed, 1 failed, 1 skipped" in again.table()


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.pop("image"), "needs image, stack and results"),
    (lambda d: d.update(results="imports.torch"), "needs image, stack and results"),
    (lambda d: d["results"][0].update(status="ok"), "row is not check, status"),
    (lambda d: d["results"][1].pop("detail"), "row is not check, status"),
    (lambda d: d.update(passed=True), "says passed=True, its rows say False"),
    (lambda d: d.update(passed="false"), "says passed='false'"),
])
def test_a_report_that_is_not_the_recorded_form_is_refused(change, problem):
    data = REPORT.to_dict()
    change(data)
    with pytest.raises(ValueError, match=problem):
        SmokeReport.from_dict(data)


def test_a_lock_with_a_damaged_smoke_report_is_one_line_and_left_as_it_was(tmp_path):
    lock = json.loads((REPO / "matrix.lock").read_text())
    lock["stacks"]["sglang-0.5.9-cu128-local"]["outcome"]["smoke"]["report"]["passed"] = False
    path = tmp_path / "matrix.lock"
    path.write_text(json.dumps(lock))
    before = path.read_bytes()
    with pytest.raises(UserError) as refused:
        store.read(path)
    assert "not a schema-2 lock (ValueError: the smoke report of sha256:" in str(refused.value)
    assert "\n" not in str(refused.value) and path.read_bytes() == before
