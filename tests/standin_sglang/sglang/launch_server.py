"""Stand-in for `python -m sglang.launch_server` (sglang 0.5.9), for tests only.

An 8-GPU tensor-parallel server cannot run here, so this program takes its
place: the same command line (the flags the entrypoint uses, with the real
names, aliases and choices of srt/server_args.py), the same log lines (shard
bars, decode stats, uvicorn access log, the ready line) and the same HTTP
endpoints and formats (/health 503 then 200, /health_generate, /model_info,
/v1/models, /get_server_info, /server_info, streaming /generate as
server-sent events, API-key check). STACK.md cites the sources.

Behaviour is set by the tests through environment variables:
  STANDIN_SHARDS=4  STANDIN_SHARD_S=0.05   checkpoint shards and seconds per shard
  STANDIN_STALL_AT=k                        after shard k, hang (no more progress)
  STANDIN_REPAINT_S=x                       while hung, repaint the stuck bar every x s
  STANDIN_CRASH_AT=k                        at shard k, log a scheduler Traceback, then hang
                                            (the parent waits on a dead child)
  STANDIN_EXIT_AT=k:code                    at shard k, exit with code, no Traceback
  STANDIN_WARMUP_S=0.2                      HTTP up, /health 503, before the ready line
  STANDIN_WARMUP_HANG=1                     never finish warm-up
  STANDIN_READY_LINE=0                      never log the ready line (ready only via /health)
  STANDIN_DIE_AFTER_READY=s:code            exit with code s seconds after becoming ready
  STANDIN_TOK_S=89.5  STANDIN_TTFT_S=0.02   decode rate and prefill time
  STANDIN_ACCEPT_LENGTH=3.0                 tokens per step when speculative
  STANDIN_DECODE_LOG_INTERVAL=40            decode steps between "Decode batch" lines
  STANDIN_WORKERS=n                         fork n TP-worker-like children (same group)
  STANDIN_IGNORE_TERM=1                     workers ignore SIGTERM (the group needs SIGKILL)
  STANDIN_ORPHAN=1                          double-fork a short-lived grandchild (re-parented)
  STANDIN_RECORD=path                       write argv, environment, pid and pgid as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY_LINE = "The server is fired up and ready to roll!"
ATTENTION_BACKEND_CHOICES = [
    "triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4",
    "flashinfer", "flashmla", "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn",
    "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
]  # fmt: skip


def env_number(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags the entrypoint passes, spelled as ServerArgs.add_cli_args spells them."""
    parser = argparse.ArgumentParser(prog="launch_server")
    parser.add_argument("--model-path", "--model", dest="model_path", required=True)
    parser.add_argument("--tokenizer-path")
    parser.add_argument("--tensor-parallel-size", "--tp-size", dest="tp_size", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", "--pp-size", dest="pp_size", type=int, default=1)
    parser.add_argument("--attention-backend", choices=ATTENTION_BACKEND_CHOICES)
    parser.add_argument("--disable-custom-all-reduce", action="store_true")
    parser.add_argument("--enable-torch-symm-mem", action="store_true")
    parser.add_argument("--enable-flashinfer-allreduce-fusion", action="store_true")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key")
    parser.add_argument(
        "--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
    )
    parser.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    parser.add_argument("--speculative-num-steps", type=int)
    parser.add_argument("--speculative-eagle-topk", type=int)
    parser.add_argument("--speculative-num-draft-tokens", type=int)
    parser.add_argument("--mem-fraction-static", type=float)
    parser.add_argument("--cuda-graph-max-bs", type=int)
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--dist-init-addr", "--nccl-init-addr")
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def log(message: str, prefix: str = "") -> None:
    """sglang's logging format (srt/utils/common.py configure_logger), on stderr."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp}{prefix}] {message}\n")
    sys.stderr.flush()


def access_log(client: str, request_line: str, status: int) -> None:
    """uvicorn's access log in sglang's format, on stdout."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write(f'[{stamp}] INFO:     {client} - "{request_line}" {status}\n')
    sys.stdout.flush()


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


def shard_bar(done: int, total: int, elapsed: float) -> str:
    """tqdm with sglang's BAR_FORMAT (srt/utils/common.py), as it reaches the log."""
    rate = done / elapsed if elapsed > 0 and done else 0.0
    remaining = clock((total - done) / rate) if rate else "?"
    rate_text = f"{rate:5.2f}it/s" if rate else "?it/s"
    percent = 100 * done / total
    return (
        f"\rLoading safetensors checkpoint shards: {percent:3.0f}% Completed | "
        f"{done}/{total} [{clock(elapsed)}<{remaining}, {rate_text}]\n"
    )


def hang() -> None:
    while True:
        time.sleep(3600)


def crash_traceback() -> None:
    """A scheduler dying during load, logged the way srt/managers/scheduler.py logs it."""
    log(
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", '
        "line 3180, in run_scheduler_process\n"
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 3 has a total capacity of 95.59 GiB of which 1.10 GiB is free.",
        " TP3",
    )


def start_workers(count: int, ignore_term: bool) -> None:
    """Children in our process group, like the TP scheduler processes."""
    for rank in range(count):
        if os.fork() == 0:
            if ignore_term:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                hang()
            finally:
                os._exit(0)


def start_orphan() -> None:
    """A grandchild whose parent exits at once: it is re-parented to PID 1 and exits soon."""
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            time.sleep(0.2)
            log(f"orphan {os.getpid()} re-parented to {os.getppid()}")
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    os.waitpid(child, 0)


def record(args: argparse.Namespace, argv: list[str]) -> None:
    path = os.environ.get("STANDIN_RECORD")
    if not path:
        return
    keep = ("SGLANG_", "NCCL_", "FLASHINFER_", "TVM_FFI_", "TRITON_", "CUDA_", "SERVE_")
    env = {name: value for name, value in os.environ.items() if name.startswith(keep)}
    with open("/proc/self/cmdline", "rb") as handle:  # what other processes see, not sys.argv
        cmdline = handle.read().decode().split("\0")[:-1]
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"argv": argv, "cmdline": cmdline, "api_key": args.api_key, "env": env, "pid": os.getpid(),
                   "pgid": os.getpgrp()}, handle)


class State:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.ready = False
        self.tok_s = env_number("STANDIN_TOK_S", 89.5)
        self.ttft_s = env_number("STANDIN_TTFT_S", 0.02)
        self.accept_length = env_number("STANDIN_ACCEPT_LENGTH", 3.0) if args.speculative_algorithm else 1.0
        self.log_interval = int(env_number("STANDIN_DECODE_LOG_INTERVAL", 40))
        self.last_gen_throughput = 0.0
        self.lock = threading.Lock()


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - http.server's signature
            pass  # access lines are written by send_response below, in uvicorn's format

        def send_response(self, code, message=None):
            client = f"{self.client_address[0]}:{self.client_address[1]}"
            access_log(client, self.requestline, code)
            super().send_response(code, message)

        def reply(self, status: int, body: dict | None = None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            # srt/utils/auth.py: /health* and /metrics never need the key.
            if self.path.startswith("/health") or self.path.startswith("/metrics"):
                return True
            key = state.args.api_key
            if not key:
                return True
            header = self.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() == "bearer" and token == key:
                return True
            self.reply(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            if not self.authorized():
                return
            path = self.path.split("?", 1)[0]
            args = state.args
            if path in ("/health", "/health_generate"):
                self.reply(200 if state.ready else 503)
            elif path == "/model_info":
                self.reply(200, {
                    "model_path": args.model_path,
                    "tokenizer_path": args.tokenizer_path or args.model_path,
                    "is_generation": True,
                    "preferred_sampling_params": None,
                    "weight_version": "default",
                    "has_image_understanding": False,
                    "has_audio_understanding": False,
                    "model_type": "kimi_k25",
                    "architectures": ["KimiK25ForConditionalGeneration"],
                })  # fmt: skip
            elif path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{
                    "id": args.model_path, "object": "model", "created": int(time.time()),
                    "owned_by": "sglang", "root": args.model_path, "parent": None,
                    "max_model_len": 262144,
                }]})  # fmt: skip
            elif path in ("/get_server_info", "/server_info"):
                internal = {"last_gen_throughput": state.last_gen_throughput}
                if args.speculative_algorithm:
                    internal["avg_spec_accept_length"] = state.accept_length
                self.reply(200, {**vars(args), "internal_states": [internal], "version": "0.5.9"})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            if not self.authorized():
                return
            if self.path.split("?", 1)[0] != "/generate":
                self.reply(404, {"detail": "Not Found"})
                return
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            input_ids = request.get("input_ids") or list(range(len(request.get("text", "").split())))
            sampling = request.get("sampling_params") or {}
            max_new = int(sampling.get("max_new_tokens", 128))
            events = generate(state, len(input_ids), max_new)
            if not request.get("stream"):
                final = None
                for final in events:
                    pass
                self.reply(200, final)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in events:
                self.chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


def generate(state: State, prompt_tokens: int, max_new: int):
    """Yield sglang's streamed outputs: cumulative text and ids, meta_info per chunk.

    Tokens are paced on an absolute schedule (prefill, then one token per 1/tok_s);
    a speculative step releases `accept_length` tokens at once.
    """
    rid = uuid.uuid4().hex
    started = time.perf_counter()
    first_at = started + state.ttft_s
    log(f"Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0, ", " TP0")  # fmt: skip
    delivered = 0
    steps = 0
    log_mark = (started, 0)
    while delivered < max_new:
        if delivered == 0:
            target = 1
        else:
            steps += 1
            target = min(max_new, 1 + int(round(steps * state.accept_length)))
        due = first_at + (target - 1) / state.tok_s
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        delivered = target
        if steps and steps % state.log_interval == 0:
            now = time.perf_counter()
            rate = (delivered - log_mark[1]) / (now - log_mark[0])
            state.last_gen_throughput = rate
            log_mark = (now, delivered)
            spec = (
                f"accept len: {state.accept_length:.2f}, accept rate: 0.67, "
                if state.args.speculative_algorithm else ""
            )  # fmt: skip
            log(f"Decode batch, #running-req: 1, #token: {prompt_tokens + delivered}, "
                f"token usage: 0.00, {spec}cuda graph: True, "
                f"gen throughput (token/s): {rate:.2f}, #queue-req: 0, ", " TP0")  # fmt: skip
        finished = delivered >= max_new
        meta = {
            "id": rid,
            "finish_reason": {"type": "length", "length": max_new} if finished else None,
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": delivered,
            "cached_tokens": 0,
        }
        if finished:
            meta["e2e_latency"] = time.perf_counter() - started
            if state.args.speculative_algorithm and steps:
                draft = (state.args.speculative_num_draft_tokens or 4) - 1
                meta["spec_verify_ct"] = steps
                meta["spec_accept_length"] = delivered / steps
                meta["spec_accept_token_num"] = delivered - steps
                meta["spec_draft_token_num"] = steps * draft
                meta["spec_accept_rate"] = (delivered - steps) / (steps * draft)
        yield {"text": " tok" * delivered, "output_ids": list(range(delivered)), "meta_info": meta}


def load_weights() -> None:
    shards = int(env_number("STANDIN_SHARDS", 4))
    per_shard = env_number("STANDIN_SHARD_S", 0.05)
    stall_at = os.environ.get("STANDIN_STALL_AT")
    crash_at = os.environ.get("STANDIN_CRASH_AT")
    exit_at, _, exit_code = os.environ.get("STANDIN_EXIT_AT", "").partition(":")
    repaint = env_number("STANDIN_REPAINT_S", 0)
    log("Load weight begin. avail mem=94.12 GB", " TP0")
    started = time.monotonic()
    sys.stderr.write(shard_bar(0, shards, 0.0))
    for done in range(1, shards + 1):
        time.sleep(per_shard)
        sys.stderr.write(shard_bar(done, shards, time.monotonic() - started))
        sys.stderr.flush()
        if crash_at and done == int(crash_at):
            crash_traceback()
            hang()
        if exit_at and done == int(exit_at):
            log("Received sigquit from a child process. It usually means the child failed.")
            sys.exit(int(exit_code or 1))
        if stall_at and done == int(stall_at):
            while repaint:
                time.sleep(repaint)
                sys.stderr.write(shard_bar(done, shards, time.monotonic() - started))
                sys.stderr.flush()
            hang()
    log("Load weight end. type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, "
        "avail mem=31.05 GB, mem usage=63.07 GB.", " TP0")  # fmt: skip
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=30.90 GB", " TP0")
    log("Capture cuda graph end. Time elapsed: 0.01 s. mem usage=0.50 GB. avail mem=30.40 GB.", " TP0")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    record(args, argv)
    log(f"server_args=ServerArgs(model_path={args.model_path!r}, tp_size={args.tp_size}, "
        f"attention_backend={args.attention_backend!r}, host={args.host!r}, port={args.port}, "
        f"api_key={args.api_key!r}, speculative_algorithm={args.speculative_algorithm!r})")  # fmt: skip
    start_workers(int(env_number("STANDIN_WORKERS", 0)), os.environ.get("STANDIN_IGNORE_TERM") == "1")
    if os.environ.get("STANDIN_ORPHAN") == "1":
        start_orphan()
    load_weights()

    state = State(args)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"INFO:     Started server process [{os.getpid()}]")
    log(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    time.sleep(env_number("STANDIN_WARMUP_S", 0.2))
    if os.environ.get("STANDIN_WARMUP_HANG") == "1":
        hang()
    state.ready = True
    if os.environ.get("STANDIN_READY_LINE", "1") == "1":
        log(READY_LINE)
    die_after, _, code = os.environ.get("STANDIN_DIE_AFTER_READY", "").partition(":")
    if die_after:
        time.sleep(float(die_after))
        log("Scheduler or DataParallelController 1234 terminated with -9", " TP0")
        return int(code or 1)
    hang()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
