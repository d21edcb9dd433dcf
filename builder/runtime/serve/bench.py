"""Single-stream decode benchmark over SGLang's native streaming /generate API.

Why our own client rather than `sglang.bench_serving` / `bench_one_batch_server`:
both load the model's tokenizer (transformers) to build prompts, and the one-batch
tool also needs /flush_cache and the metrics endpoints; this client needs only the
standard library and token ids, so the same code runs in the image, on a bare host
with `--url`, and against the test stand-in. It sends what bench_one_batch_server
sends for batch size 1: a `/generate` request with `input_ids`, `max_new_tokens`,
`ignore_eos` and `stream: true`, read as server-sent events (`data: {...}` lines,
then `data: [DONE]`).

Per request it measures
  ttft      time to the first chunk carrying a token,
  tok/s     decode rate, (completion_tokens - 1) / (latency - ttft): the first token
            comes from prefill, every later one from a decode step (bench_one_batch_server
            divides all tokens by the same interval; with 256 output tokens that reads 0.4 % higher),
  tpot      (latency - ttft) / (completion_tokens - 1),
  itl       gaps between chunks (a speculative step delivers several tokens in one chunk),
  accept length  meta_info.spec_accept_length, when the server decodes speculatively.
Prompts are distinct per request (seeded), so the radix cache never turns a repeat into a hit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import time
import urllib.error
import urllib.request
from typing import Callable, Iterable

from builder.runtime.serve.errors import EXIT_OK, EXIT_REGRESSION, BenchFailed

REPORT_SCHEMA = 1
TOKEN_ID_RANGE = (1000, 20000)  # inside every real vocabulary, clear of special tokens


@dataclasses.dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    warmup: int
    repetitions: int
    seed: int = 0
    timeout_s: float = 600.0


@dataclasses.dataclass(frozen=True)
class Reference:
    """The figure a run is judged against, and why that one."""

    tok_s: float | None  # None: nothing to judge against
    why: str
    figure: dict | None = None  # the reference figure as stack.json carries it, with its provenance

    def to_dict(self) -> dict:
        return {"tok_s": self.tok_s, "why": self.why, "figure": self.figure}


def choose_reference(stack: dict, mode: str, given: float | None = None) -> Reference:
    """A figure given on the command line; else the row's own pinned figure for the mode; else the
    figure of the row it replaced ("no regression against the stack it replaced"); else none."""
    if given is not None:
        return Reference(given, "given on the command line (--reference)")
    figures = stack["serve"]["modes"][mode]["reference"]
    name, replaced = stack["stack"], stack["replaces"]
    if figures["own"]:
        return Reference(figures["own"]["tok_s"], f"{name}'s own pinned figure for {mode}", figures["own"])
    if figures["replaced"]:
        return Reference(figures["replaced"]["tok_s"],
                         f"no figure is pinned for {name} {mode}: no regression against {replaced}, "
                         f"the stack it replaced ({figures['replaced']['stack']} {mode})", figures["replaced"])
    nor = f" nor for {replaced}, the stack it replaced" if replaced else ""
    return Reference(None, f"no figure is pinned for {name} {mode}{nor}")


# The settings that decide how the TP group all-reduces: a figure measured under one set says nothing
# about another, so the report names them and a run whose settings differ from its mode's is not judged.
COMMUNICATION_ARGS = ("tp_size", "disable_custom_all_reduce", "enable_torch_symm_mem",
                      "enable_flashinfer_allreduce_fusion", "flashinfer_allreduce_fusion_backend",
                      "enforce_disable_flashinfer_allreduce_fusion")
COMMUNICATION_ENV = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "SGLANG_PCIE_IPC_MAX_NUMEL")
COMMUNICATION_ENV_PREFIXES = ("NCCL_",)


def _communication_env(env: dict) -> dict:
    return {name: str(value) for name, value in sorted(env.items())
            if name in COMMUNICATION_ENV or name.startswith(COMMUNICATION_ENV_PREFIXES)}


def communication(stack: dict, mode: str, environ: dict | None = None) -> dict:
    """{"args", "env"}: the mode's all-reduce settings; with `environ` (the caller's environment, which
    the entrypoint passes on to the server) the communication variables it sets win over the mode's."""
    profile = stack["serve"]["modes"][mode]
    env = {**stack["serve"].get("env", {}), **profile.get("env", {}), **_communication_env(environ or {})}
    return {"args": {name: profile["args"][name] for name in COMMUNICATION_ARGS if name in profile["args"]},
            "env": _communication_env(env)}


def comparable(reference: Reference, declared: dict, effective: dict) -> Reference:
    """The reference, unless it is a pinned figure of the mode and this run's communication settings
    are not the mode's: then nothing. A figure given on the command line is the caller's to judge."""
    if reference.tok_s is None or reference.figure is None or declared == effective:
        return reference
    changed = sorted(name for name in {*declared["env"], *effective["env"]}
                     if declared["env"].get(name) != effective["env"].get(name))
    return Reference(None, f"not judged: the run's communication settings differ from the mode's "
                           f"({', '.join(changed)}), and {reference.why} is the mode's", reference.figure)


@dataclasses.dataclass(frozen=True)
class BenchPlan:
    """What to measure, what to compare it with, where the report goes."""

    stack: dict
    mode: str
    workload: Workload
    reference: Reference
    tolerance: float
    output: str
    communication: dict | None = None  # communication(): what the run's reduction settings were


@dataclasses.dataclass(frozen=True)
class RequestResult:
    ttft_s: float
    latency_s: float
    completion_tokens: int
    itl_s: tuple[float, ...]
    accept_length: float | None

    @property
    def decode_tok_s(self) -> float:
        return (self.completion_tokens - 1) / (self.latency_s - self.ttft_s)

    @property
    def tpot_s(self) -> float:
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)


def prompt_ids(index: int, length: int, seed: int) -> list[int]:
    rng = random.Random(f"{seed}:{index}")
    return [rng.randrange(*TOKEN_ID_RANGE) for _ in range(length)]


def generate_payload(input_ids: list[int], output_len: int) -> dict:
    return {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }


def read_stream(lines: Iterable[bytes], started: float, clock: Callable[[], float]) -> RequestResult:
    """Time one streamed /generate response; `lines` are the raw SSE lines as they arrive."""
    first_token_at = None
    chunk_times: list[float] = []
    completion_tokens = 0
    meta: dict = {}
    other = ""  # the first line that is not a server-sent event: what came back instead of a stream
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            other = other or line
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        arrived = clock()
        try:
            event = json.loads(data)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            raise BenchFailed(f"server streamed an event that is not a JSON object: {data[:120]!r}")
        if "error" in event:
            raise BenchFailed(f"server answered /generate with an error: {event['error']}")
        meta = event.get("meta_info", {})
        tokens = int(meta.get("completion_tokens", 0))
        if tokens > completion_tokens:
            if first_token_at is None:
                first_token_at = arrived
            chunk_times.append(arrived)
            completion_tokens = tokens
    if first_token_at is None:
        answered = f"; it answered {other[:120]!r} instead of an event stream" if other else ""
        raise BenchFailed(f"server streamed no tokens for /generate{answered}")
    if completion_tokens < 2 or len(chunk_times) < 2:
        raise BenchFailed(
            f"server delivered {completion_tokens} tokens in {len(chunk_times)} chunk(s); "
            "a decode rate needs a streamed response of at least 2 tokens"
        )
    accept = meta.get("spec_accept_length")
    return RequestResult(
        ttft_s=first_token_at - started,
        latency_s=chunk_times[-1] - started,  # the last token, not the [DONE] after it
        completion_tokens=completion_tokens,
        itl_s=tuple(later - earlier for earlier, later in zip(chunk_times, chunk_times[1:])),
        accept_length=float(accept) if accept is not None else None,
    )


def stream_generate(
    base_url: str, input_ids: list[int], output_len: int, api_key: str | None, timeout_s: float
) -> RequestResult:
    body = json.dumps(generate_payload(input_ids, output_len)).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(base_url.rstrip("/") + "/generate", body, headers, method="POST")
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return read_stream(response, started, time.perf_counter)
    except urllib.error.HTTPError as error:
        hint = " (set SERVE_API_KEY or pass --api-key-file)" if error.code == 401 else ""
        raise BenchFailed(f"POST {request.full_url} answered HTTP {error.code}{hint}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise BenchFailed(f"POST {request.full_url} failed: {reason}") from None


def model_path(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> str | None:
    """The served model's path from /model_info, for the report; None when unavailable."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(base_url.rstrip("/") + "/model_info", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.load(response).get("model_path")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def run_workload(
    base_url: str,
    workload: Workload,
    api_key: str | None,
    say,
    on_measure: Callable[[], None] = lambda: None,
    request=stream_generate,
) -> list[RequestResult]:
    """Warm-up requests, then the measured repetitions, one at a time."""
    results = []
    total = workload.warmup + workload.repetitions
    for index in range(total):
        if index == workload.warmup:
            on_measure()
        ids = prompt_ids(index, workload.input_len, workload.seed)
        result = request(base_url, ids, workload.output_len, api_key, workload.timeout_s)
        phase = "warm-up" if index < workload.warmup else "run"
        say(
            f"bench {phase} {index + 1}/{total}: {result.decode_tok_s:.2f} tok/s, "
            f"ttft {result.ttft_s * 1000:.0f} ms, {result.completion_tokens} tokens"
        )
        if index >= workload.warmup:
            results.append(result)
    return results


def spread_stats(values: list[float]) -> dict | None:
    """median, min, max and spread ((max - min) / median) of a series, rounded for stable JSON."""
    if not values:
        return None
    median = statistics.median(values)
    return {
        "median": round(median, 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "spread": round((max(values) - min(values)) / median, 4) if median else None,
        "n": len(values),
    }


def summarize(results: list[RequestResult]) -> dict:
    accept = [r.accept_length for r in results if r.accept_length is not None]
    return {
        "output_tok_s": spread_stats([r.decode_tok_s for r in results]),
        "ttft_ms": spread_stats([r.ttft_s * 1000 for r in results]),
        "tpot_ms": spread_stats([r.tpot_s * 1000 for r in results]),
        "itl_ms": spread_stats([gap * 1000 for r in results for gap in r.itl_s]),
        "accept_length": spread_stats(accept),
    }


def verdict(measured: float, reference: float | None, tolerance: float) -> tuple[float | None, str]:
    """(ratio, verdict): 'regression' below reference by more than the tolerance."""
    if not reference:
        return None, "unpinned"
    ratio = measured / reference
    if ratio < 1.0 - tolerance:
        return ratio, "regression"
    if ratio > 1.0 + tolerance:
        return ratio, "faster"
    return ratio, "pass"


def build_report(
    *,
    stack: dict,
    mode: str,
    url: str,
    workload: Workload,
    results: list[RequestResult],
    reference: Reference,
    tolerance: float,
    model: str | None = None,
    gpus: tuple[str, ...] = (),
    server_gen_tok_s: list[float] | None = None,
    communication_settings: dict | None = None,
) -> dict:
    metrics = summarize(results)
    tok_s = metrics["output_tok_s"]["median"]
    ratio, outcome = verdict(tok_s, reference.tok_s, tolerance)
    return {
        "schema": REPORT_SCHEMA,
        "stack": stack["stack"],
        "cuda": stack["cuda"],
        "distributions": stack["distributions"],
        "mode": mode,
        "communication": communication_settings,
        "model": model,
        "url": url,
        "gpus": list(gpus),
        "workload": {
            "concurrency": 1,
            "input_len": workload.input_len,
            "output_len": workload.output_len,
            "repetitions": workload.repetitions,
            "seed": workload.seed,
            "warmup": workload.warmup,
        },
        "metrics": metrics,
        "server_log_gen_tok_s": spread_stats(server_gen_tok_s or []),
        "tok_s": tok_s,
        "ttft_ms": metrics["ttft_ms"]["median"],
        "reference_tok_s": reference.tok_s,
        "reference": reference.to_dict(),
        "ratio": round(ratio, 4) if ratio is not None else None,
        "tolerance": tolerance,
        "verdict": outcome,
    }


def summary_line(report: dict) -> str:
    line = f"bench {report['mode']}: {report['tok_s']:.2f} tok/s (median of {report['workload']['repetitions']})"
    if report["verdict"] == "unpinned":
        return line + f", nothing to judge against: {report['reference']['why']}"
    change = (report["ratio"] - 1.0) * 100
    return (
        f"{line}, reference {report['reference_tok_s']:.2f}, {change:+.1f}% "
        f"(tolerance {report['tolerance'] * 100:.0f}%): {report['verdict'].upper()}"
    )


def exit_code(report: dict) -> int:
    return EXIT_REGRESSION if report["verdict"] == "regression" else EXIT_OK


def write_report(report: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
        handle.write("\n")


def benchmark(
    plan: BenchPlan,
    url: str,
    api_key: str | None,
    say,
    gpus: tuple[str, ...] = (),
    server_log: list[float] | None = None,
) -> int:
    """Measure, compare, write the report; 1 on a regression.

    `server_log` is the launched server's decode figures as they arrive; the
    ones logged from the first measured request on go into the report.
    """
    first = {"index": 0}

    def measuring() -> None:
        first["index"] = len(server_log) if server_log is not None else 0

    results = run_workload(url, plan.workload, api_key, say, on_measure=measuring)
    report = build_report(
        stack=plan.stack,
        mode=plan.mode,
        url=url,
        workload=plan.workload,
        results=results,
        reference=plan.reference,
        tolerance=plan.tolerance,
        model=model_path(url, api_key),
        gpus=gpus,
        server_gen_tok_s=server_log[first["index"] :] if server_log is not None else None,
        communication_settings=plan.communication,
    )
    write_report(report, plan.output)
    say(f"reference: {plan.reference.why}")
    say(summary_line(report))
    say(f"report: {plan.output}")
    return exit_code(report)
