"""Reading SGLang's log while it starts: readiness, progress, failure, decode speed.

The formats are sglang 0.5.9's (see shared/STACK.md):
  ready      `The server is fired up and ready to roll!` (srt/entrypoints/http_server.py)
  shards     `Loading safetensors checkpoint shards:  75% Completed | 48/64 [00:22<00:07,  2.14it/s]`
             (tqdm with srt/utils/common.py BAR_FORMAT)
  decode     `Decode batch, #running-req: 1, ..., gen throughput (token/s): 89.50, #queue-req: 0,`
  access     `[2026-01-02 03:04:05] INFO:     127.0.0.1:5678 - "GET /health HTTP/1.1" 503`
             (uvicorn's access log with sglang's format, srt/utils/common.py set_uvicorn_logging_configs)
"""

from __future__ import annotations

import dataclasses
import re

READY_LINE = "The server is fired up and ready to roll!"
TRACEBACK_LINE = "Traceback (most recent call last):"
SHARDS = re.compile(
    r"(?P<desc>[\w .-]*checkpoint shards):\s*(?P<pct>\d+)%\s*Completed\s*\|\s*(?P<n>\d+)/(?P<total>\d+)"
)
# The answers to our own readiness probes: logged by uvicorn, but not progress.
HEALTH_ACCESS = re.compile(r'"GET /health(?:_generate)?(?:\?\S*)? HTTP/[\d.]+" \d{3}')
GEN_THROUGHPUT = re.compile(r"gen throughput \(token/s\):\s*(?P<value>[0-9.]+)")
ACCEPT_LENGTH = re.compile(r"accept len:\s*(?P<value>[0-9.]+)")
QUOTE_LIMIT = 160


@dataclasses.dataclass(frozen=True)
class ShardPosition:
    desc: str
    done: int
    total: int
    percent: int

    def describe(self) -> str:
        return f"checkpoint shards {self.done}/{self.total} ({self.percent}%)"


def parse_shards(line: str) -> ShardPosition | None:
    match = SHARDS.search(line)
    if match is None:
        return None
    return ShardPosition(
        match["desc"].strip(), int(match["n"]), int(match["total"]), int(match["pct"])
    )


def parse_gen_throughput(line: str) -> float | None:
    match = GEN_THROUGHPUT.search(line)
    return float(match["value"]) if match else None


class StartupProgress:
    """What the log says about a starting server, and whether it is still moving.

    Progress is any new log line, except a shard bar redrawn at the same count
    (tqdm may repaint a stuck bar) and the access-log lines of our own /health
    probes: neither may hide a stall.
    """

    def __init__(self, started_at: float):
        self.started_at = started_at
        self.last_progress_at = started_at
        self.shards: ShardPosition | None = None
        self.last_line: str | None = None
        self.last_was_shards = False
        self.ready = False
        self.traceback_seen = False

    def feed(self, line: str, now: float) -> None:
        text = line.strip()
        if not text or HEALTH_ACCESS.search(text):
            return
        position = parse_shards(text)
        if position is not None:
            moved = self.shards is None or (position.desc, position.done, position.total) != (
                self.shards.desc,
                self.shards.done,
                self.shards.total,
            )
            self.shards = position
            self.last_was_shards = True
            if moved:
                self.last_progress_at = now
            return
        self.last_line = text
        self.last_was_shards = False
        self.last_progress_at = now
        if READY_LINE in text:
            self.ready = True
        if TRACEBACK_LINE in text:  # also mid-line: "Scheduler hit an exception: Traceback ..."
            self.traceback_seen = True

    def idle_for(self, now: float) -> float:
        return now - self.last_progress_at

    def where(self) -> str:
        """Where the load is, in words: the shard count, else the last log line."""
        if self.last_was_shards and self.shards is not None:
            return f"at {self.shards.describe()}"
        if self.last_line is not None:
            quoted = self.last_line
            if len(quoted) > QUOTE_LIMIT:
                quoted = quoted[: QUOTE_LIMIT - 3] + "..."
            return f"after log line {quoted!r}"
        return "before any output"

    def stall_message(self, now: float) -> str:
        return f"stalled {self.where()} for {self.idle_for(now):.0f} s"

    def status(self, now: float) -> str:
        return (
            f"still starting after {now - self.started_at:.0f} s, {self.where()}; "
            f"last progress {self.idle_for(now):.0f} s ago"
        )
