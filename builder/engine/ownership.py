"""Which `builder` run owns a smoke container or a candidate tag, and whether that run is gone.

A run is known by its host and process id. Containers carry it as a label; a candidate tag carries it
in the tag itself (a label would change the image id). The sweep removes only what a run of this host
left whose process no longer exists: never another host's, a live run's, or anything unmarked.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

OWNER_LABEL = "dev.sglang-builder.owner"
# "<name>-candidate:<rest>-<12 hex of the inputs hash>.<host>.<pid>", with an optional registry part.
_CANDIDATE = re.compile(r"^(?:[^/]+/)*[^/:]+-candidate:.+-[0-9a-f]{12}\.(?P<host>[A-Za-z0-9_-]{1,40})\.(?P<pid>\d+)$")
_HOST_CHARS = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int

    @classmethod
    def current(cls) -> Owner:
        return cls(_host_token(socket.gethostname()), os.getpid())

    @classmethod
    def from_label(cls, value: str) -> Owner | None:
        host, _, pid = value.rpartition(":")
        return cls(host, int(pid)) if host and pid.isdigit() else None

    @classmethod
    def from_candidate_tag(cls, tag: str) -> Owner | None:
        match = _CANDIDATE.match(tag)
        return cls(match["host"], int(match["pid"])) if match else None

    def label(self) -> str:
        return f"{self.host}:{self.pid}"

    def tag_suffix(self) -> str:
        return f".{self.host}.{self.pid}"

    def is_gone(self) -> bool:
        """Dead on this host. Another host's run is never judged from here."""
        return self.host == _host_token(socket.gethostname()) and not process_alive(self.pid)


def _host_token(hostname: str) -> str:
    return _HOST_CHARS.sub("-", hostname)[:40] or "host"


def process_alive(pid: int) -> bool:
    """Whether a process of this host has the id `pid` (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
