"""The provenance statement names the build's inputs and platform, never the machine it ran on."""

from __future__ import annotations

import json
import platform
import socket
from datetime import datetime, timezone

from builder.build_stack import provenance
from builder.build_stack.context import BuildInputs


def test_the_statement_holds_no_host_name(monkeypatch):
    name = "build-7.internal.example"
    monkeypatch.setattr(platform, "node", lambda: name)
    monkeypatch.setattr(socket, "gethostname", lambda: name)
    inputs = BuildInputs("demo", "images/demo/Dockerfile", "FROM scratch\n", "debian:bookworm", "", 1767225600, ())
    moment = datetime(2026, 1, 1, tzinfo=timezone.utc)
    document = provenance.statement(
        inputs, image_id="sha256:" + "a" * 64, immutable_tag="demo:1", engine="buildah", engine_version="1.39.3",
        source=provenance.SourceState("", False, ""), distributions=(), started=moment, finished=moment,
        durations_s={"build": 1.0}, external={},
    )  # fmt: skip
    text = json.dumps(document)
    assert name not in text and "build-7" not in text and "hostname" not in text
    (host,) = [b for b in document["predicate"]["runDetails"]["byproducts"] if b["name"] == "host"]
    assert host["annotations"] == {"platform": platform.platform(), "python": platform.python_version()}
