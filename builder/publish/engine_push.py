"""`builder push` of an image buildah holds: the engine pushes it straight to the registry
(StorageEngine.push_to_registry: from the builder's OCI layout when it wrote the image, blobs as written,
engine/layout_push.py; else from its storage), so publishing needs no copy of the image in the Docker
daemon (CI builds and pushes this way).

The credentials are the ones the Docker config holds for the host (what the daemon would use), handed
to the engine in a private auth file (empty when there are none), never on the command line. Whether
the engine verifies TLS is the transport policy's to say (net/transport_policy.py): off only for a
loopback registry, judged by its parsed host, as the Docker daemon speaks plain HTTP to it.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path

from builder.engine.protocol import StorageEngine
from builder.errors import BuildFailure
from builder.net import transport_policy
from builder.net.registry_auth import Credentials
from builder.net.registry_http import TransientError


def push(engine: StorageEngine, image_id: str, reference: str, host: str, credentials: Credentials | None,
         is_transient, policy: transport_policy.Policy | None = None) -> str:
    """Push image_id as reference (host/repository:tag); the manifest digest the registry stored."""
    policy = policy or transport_policy.load()
    with tempfile.TemporaryDirectory(prefix="builder-push-") as scratch:
        # Always our own auth file: exactly the Docker config's credentials, whatever else the engine would read.
        auth_file = _auth_file(Path(scratch), host, credentials)
        try:
            return engine.push_to_registry(image_id, reference, transport_policy.engine_tls_verify(host, policy),
                                           auth_file)
        except BuildFailure as error:
            if is_transient(str(error)):
                raise TransientError(str(error)) from None
            raise


def _auth_file(directory: Path, host: str, credentials: Credentials | None) -> Path:
    path = directory / "auth.json"
    auths = {}
    if credentials is not None:
        auths[host] = {"auth": base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"auths": auths}, handle)
    return path
