"""Which run owns a smoke container or a candidate tag, and the smoke container's limits: no engine needed."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys

import pytest

from builder.engine.ownership import Owner
from builder.engine import container_limits


def test_a_candidate_tag_carries_its_owner_and_nothing_else_parses_as_one():
    owner = Owner.current()
    tag = "localhost/sglang-candidate:0.5.9-cu128-local-409097f67e42" + owner.tag_suffix()
    assert Owner.from_candidate_tag(tag) == owner
    assert Owner.from_candidate_tag("sglang-candidate:0.5.9-cu128-409097f67e42.vm.17") == Owner("vm", 17)
    for other in ("localhost/sglang-candidate:0.5.9-cu128-local-409097f67e42",  # the old form: nobody's
                  "localhost/sglang:0.5.9-cu128-local-409097f67e42.vm.17",  # not a candidate repository
                  "localhost/sglang-candidate:0.5.9-cu128-local-40909.vm.17",  # no inputs hash
                  "localhost/sglang-candidate:0.5.9-cu128-local-409097f67e42.vm.x17", "", ":"):
        assert Owner.from_candidate_tag(other) is None, other


def test_a_label_carries_its_owner():
    assert Owner.from_label("ci-runner-3:4242") == Owner("ci-runner-3", 4242)
    for bad in ("", "4242", "host:", "host:12a", ":12"):
        assert Owner.from_label(bad) is None, bad
    assert Owner.from_label(Owner.current().label()) == Owner.current()


def test_the_host_token_fits_a_tag(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "build host.example.org/" + "x" * 80)
    owner = Owner.current()
    assert owner.host == ("build-host-example-org-" + "x" * 80)[:40]
    assert Owner.from_candidate_tag("sglang-candidate:a-0123456789ab" + owner.tag_suffix()) == owner


def test_only_a_dead_run_of_this_host_is_gone():
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    here = Owner.current().host
    assert Owner(here, int(finished.stdout)).is_gone()  # reaped: its pid names nothing (or a newer process)
    assert not Owner.current().is_gone()
    assert not Owner("another-host", int(finished.stdout)).is_gone()  # never judged from here


def test_the_smoke_container_gets_this_processs_limits_with_nproc_under_pid_max():
    limits = {limit["Name"]: (limit["Soft"], limit["Hard"]) for limit in container_limits.own_ulimits()}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        assert limits["nofile"] == (soft, hard)
    pid_max = int(open("/proc/sys/kernel/pid_max").read())
    assert max(limits["nproc"]) <= pid_max


@pytest.mark.parametrize("value, cap, expected", [
    (resource.RLIM_INFINITY, None, None), (resource.RLIM_INFINITY, 32768, 32768), (96364, 32768, 32768),
    (1024, 32768, 1024), (20000, None, 20000)])
def test_limits_are_capped_and_unlimited_is_left_to_the_engine(value, cap, expected):
    assert container_limits._capped(value, cap) == expected
