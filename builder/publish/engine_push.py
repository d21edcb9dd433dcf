"""`builder push` of an image that is only in buildah's storage: `buildah push` straight to the
registry, so publishing needs no copy of the image in the Docker daemon (CI builds and pushes this way).

The credentials are the ones the Docker config holds for the host (what the daemon would use), handed
to buildah in a private auth file (empty when there are none), never on the command line. Whether
buildah verifies TLS is the transport policy's to say (publish/transport_policy.py): off only for a
loopback registry, judged by its parsed host, as the Docker daemon speaks plain HTTP to it.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path

from builder.engine.process import run_quiet
from builder.errors import BuildFailure
from builder.publish import transport_policy
from builder.publish.registry_auth import Credentials
from builder.publish.registry_http import TransientError


def push(image_id: str, reference: str, host: str, credentials: Credentials | None,
         is_transient, policy: transport_policy.Policy | None = None) -> str:
    """Push image_id as reference (host/repository:tag); the manifest digest the registry stored."""
    with tempfile.TemporaryDirectory(prefix="builder-push-") as scratch:
        digest_file = Path(scratch) / "digest"
        argv = ["buildah", "push", "--quiet", "--digestfile", str(digest_file)]
        policy = policy or transport_policy.load()
        argv.append(f"--tls-verify={'true' if transport_policy.engine_tls_verify(host, policy) else 'false'}")
        # Always our own auth file: exactly the Docker config's credentials, whatever else buildah would read.
        argv += ["--authfile", str(_auth_file(Path(scratch), host, credentials))]
        argv += [image_id, f"docker://{reference}"]
        try:
            run_quiet(argv, f"buildah push {reference}")
        except BuildFailure as error:
            if is_transient(str(error)):
                raise TransientError(str(error)) from None
            raise
        digest = digest_file.read_text().strip() if digest_file.is_file() else ""
    if not digest.startswith("sha256:"):
        raise BuildFailure(f"push {reference}: buildah reported no digest")
    return digest


def _auth_file(directory: Path, host: str, credentials: Credentials | None) -> Path:
    path = directory / "auth.json"
    auths = {}
    if credentials is not None:
        auths[host] = {"auth": base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"auths": auths}, handle)
    return path
