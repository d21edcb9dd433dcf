"""The benchmark client's arithmetic: stream timing, statistics, verdict, report."""

from __future__ import annotations

import json

import pytest

from builder.runtime import stackinfo
from builder.runtime.serve import bench
from builder.runtime.serve.errors import BenchFailed
from standin_sglang import harness


def sse(completion_tokens: int, finished: bool = False, **meta) -> bytes:
    info = {
        "id": "r1",
        "finish_reason": {"type": "length", "length": completion_tokens} if finished else None,
        "prompt_tokens": 128,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
        **meta,
    }
    return b"data: " + json.dumps({"text": "", "output_ids": [], "meta_info": info}).encode() + b"\n"


def ticking(times):
    """A clock answering the given times in order."""
    values = iter(times)
    return lambda: next(values)


def test_stream_timing_follows_the_chunks():
    # prefill answers at 0.05 s; then 4 decode steps 0.01 s apart; [DONE] arrives later
    lines = [sse(1), b"\n", sse(2), b"\n", sse(3), sse(4), sse(5, finished=True), b"data: [DONE]\n"]
    clock = ticking([0.05, 0.06, 0.07, 0.08, 0.09])
    result = bench.read_stream(lines, started=0.0, clock=clock)
    assert result.ttft_s == pytest.approx(0.05)
    assert result.latency_s == pytest.approx(0.09)
    assert result.completion_tokens == 5
    assert result.decode_tok_s == pytest.approx(100.0)  # 4 decode tokens in 0.04 s
    assert result.tpot_s == pytest.approx(0.01)
    assert result.itl_s == pytest.approx((0.01, 0.01, 0.01, 0.01))
    assert result.accept_length is None


def test_speculative_chunks_carry_several_tokens_and_the_accept_length():
    lines = [sse(1), sse(4), sse(7), sse(10, finished=True, spec_accept_length=3.0, spec_verify_ct=3)]
    result = bench.read_stream(lines, started=0.0, clock=ticking([0.05, 0.08, 0.11, 0.14]))
    assert result.decode_tok_s == pytest.approx(100.0)  # 9 tokens after the first in 0.09 s
    assert result.itl_s == pytest.approx((0.03, 0.03, 0.03))
    assert result.accept_length == 3.0


def test_error_event_and_unstreamed_answers_fail_clearly():
    error = b'data: {"error": {"message": "prompt too long"}}\n'
    with pytest.raises(BenchFailed, match="server answered /generate with an error: {'message': 'prompt too long'}"):
        bench.read_stream([error], 0.0, ticking([0.1]))
    with pytest.raises(BenchFailed, match="server delivered 64 tokens in 1 chunk"):
        bench.read_stream([sse(64, finished=True)], 0.0, ticking([0.5]))
    with pytest.raises(BenchFailed, match="server streamed no tokens"):
        bench.read_stream([b"data: [DONE]\n"], 0.0, ticking([]))


@pytest.mark.parametrize(
    "measured, reference, verdict",
    [
        (83.9, 89.5, "regression"),  # triton's 6 % loss on this stack
        (86.8, 89.5, "regression"),  # 3.02 % down
        (87.0, 89.5, "pass"),  # 2.8 % down
        (89.5, 89.5, "pass"),
        (96.1, 96.1, "pass"),
        (100.0, 89.5, "faster"),
        (54.1, 96.1, "regression"),  # eagle3 on the CUDA 12.8 stack
        (89.5, None, "unpinned"),
    ],
)
def test_verdict_against_the_pinned_figure(measured, reference, verdict):
    assert bench.verdict(measured, reference, 0.03)[1] == verdict


def test_spread_statistics():
    assert bench.spread_stats([90.0, 88.0, 89.0]) == {
        "median": 89.0, "min": 88.0, "max": 90.0, "spread": 0.0225, "n": 3,
    }  # fmt: skip
    assert bench.spread_stats([]) is None


def test_prompts_are_deterministic_distinct_and_in_range():
    first = bench.prompt_ids(0, 128, seed=0)
    assert first == bench.prompt_ids(0, 128, seed=0)
    assert first != bench.prompt_ids(1, 128, seed=0)
    assert len(first) == 128 and all(1000 <= token < 20000 for token in first)


def test_warm_up_is_not_measured():
    calls, marks = [], []

    def fake_request(url, ids, output_len, api_key, timeout):
        calls.append(ids)
        ttft = 1.0 if len(calls) <= 2 else 0.1  # slow warm-up must not count
        return bench.RequestResult(ttft, ttft + 0.5, 51, (0.01,), None)

    workload = bench.Workload(input_len=8, output_len=51, warmup=2, repetitions=3)
    results = bench.run_workload(
        "http://x", workload, None, lambda message: None,
        on_measure=lambda: marks.append(len(calls)), request=fake_request,
    )  # fmt: skip
    assert len(calls) == 5 and len(results) == 3
    assert marks == [2]
    assert all(result.ttft_s == 0.1 for result in results)
    assert len({tuple(ids) for ids in calls}) == 5  # no prompt repeats: no radix-cache hits


RENDERED_CU130 = harness.REPO / "images" / "sglang-0.5.9-cu130" / "stack.json"


def decode_results(tok_s: float, repetitions: int = 2) -> list:
    """Requests whose 64 decode tokens came at `tok_s`."""
    return [bench.RequestResult(0.05, 0.05 + 64 / tok_s, 65, (1 / tok_s,), None)] * repetitions


def judged(stack: dict, mode: str, tok_s: float, given: float | None = None) -> dict:
    return bench.build_report(
        stack=stack, mode=mode, url="http://h:30000",
        workload=bench.Workload(input_len=128, output_len=65, warmup=1, repetitions=2),
        results=decode_results(tok_s), reference=bench.choose_reference(stack, mode, given),
        tolerance=stack["bench"]["regression_tolerance"], model="/models/M", gpus=("RTX",) * 8,
    )  # fmt: skip


def test_cuda13_baseline_is_judged_against_the_stack_it_replaced():
    """No figure is recorded for CUDA 13 baseline with flashinfer: the rendered image judges it against
    the CUDA 12.8 row's 89.5, as the deployment caught triton's 83.9 (a 6% regression)."""
    stack = stackinfo.load(str(RENDERED_CU130))
    caught = judged(stack, "baseline", 83.9)
    assert caught["verdict"] == "regression" and bench.exit_code(caught) == 1
    assert caught["reference_tok_s"] == 89.5 and caught["ratio"] == pytest.approx(0.9374, abs=1e-4)
    assert caught["reference"]["why"] == (
        "no figure is pinned for sglang-0.5.9-cu130 baseline: no regression against sglang-0.5.9-cu128, "
        "the stack it replaced (sglang-0.5.9-cu128 baseline)")
    figure = caught["reference"]["figure"]
    assert (figure["stack"], figure["mode"], figure["attention_backend"], figure["source"]) == (
        "sglang-0.5.9-cu128", "baseline", "likely flashinfer", "deployment notes")
    assert bench.summary_line(caught) == (
        "bench baseline: 83.90 tok/s (median of 2), reference 89.50, -6.3% (tolerance 3%): REGRESSION")
    passing = judged(stack, "baseline", 88.0)
    assert passing["verdict"] == "pass" and bench.exit_code(passing) == 0
    assert passing["reference"] == caught["reference"]


def test_a_rows_own_pinned_figure_comes_before_the_replaced_rows():
    stack = stackinfo.load(str(RENDERED_CU130))
    report = judged(stack, "eagle3", 95.0)
    assert report["reference_tok_s"] == 96.1 and report["verdict"] == "pass"
    assert report["reference"]["why"] == "sglang-0.5.9-cu130's own pinned figure for eagle3"
    assert judged(stack, "eagle3", 54.1)["verdict"] == "regression"  # 54.1 was the old stack's EAGLE-3


def test_a_figure_on_the_command_line_wins_and_no_figure_is_unpinned():
    stack = stackinfo.load(str(RENDERED_CU130))
    given = judged(stack, "baseline", 83.9, given=80.0)
    assert given["reference"]["why"] == "given on the command line (--reference)" and given["verdict"] == "faster"
    unpinned = judged(stack, "baseline-fusion", 83.9)
    assert unpinned["verdict"] == "unpinned" and unpinned["reference_tok_s"] is None
    assert bench.summary_line(unpinned) == (
        "bench baseline-fusion: 83.90 tok/s (median of 2), nothing to judge against: no figure is pinned for "
        "sglang-0.5.9-cu130 baseline-fusion nor for sglang-0.5.9-cu128, the stack it replaced")


def test_report_carries_the_comparison_and_regression_exits_1():
    stack = stackinfo.load(str(harness.FIXTURE))
    report = judged(stack, "baseline", 83.9)
    assert report["tok_s"] == pytest.approx(83.9)
    assert report["verdict"] == "regression"
    assert report["stack"] == "sglang-0.5.9-cu130" and report["mode"] == "baseline"
    assert report["reference_tok_s"] == 89.5 and report["ttft_ms"] == pytest.approx(50.0)
    assert bench.exit_code(report) == 1
    passing = dict(report, verdict="pass")
    assert bench.exit_code(passing) == 0
