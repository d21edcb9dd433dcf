"""Push a stack's immutable tag to a registry and pull it back by digest through the Docker daemon. An
image buildah holds is pushed by the engine (publish/engine_push.py: from the builder's OCI layout when
it wrote the image); the daemon pushes what only it holds.

Transient failures (connection errors, HTTP 5xx) are retried with exponential backoff; anything
else fails at once. The lock records a push only after the registry has the image, and a pull is
checked against the lock: same manifest digest, same image id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests

from builder.engine.daemon import docker_client
from builder.engine.protocol import StorageEngine
from builder.errors import BuildFailure, UserError, one_line
from builder.lock import records, store
from builder.lock.model import PushRecord
from builder.net import registry_auth, transport_policy
from builder.net.registry_http import ACCEPT_MANIFESTS, Retry, TransientError, api_get, get_manifest, reason
from builder.net.transport_policy import Policy
from builder.publish import engine_push

# What the daemon says when the registry (or the way to it) failed, not the request.
_TRANSIENT = re.compile(
    r"connection refused|connection reset|i/o timeout|timeout|EOF|no route to host|"
    r"unexpected HTTP status: 5\d\d|status code 5\d\d|5\d\d (Internal Server Error|Bad Gateway|"
    r"Service Unavailable|Gateway Timeout)|TLS handshake|server misbehaving",
    re.IGNORECASE,
)


# host[:port] or [v6]:port, then a repository path.
_REGISTRY = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?(?:/[a-z0-9._/-]+)?")


def is_transient(message: str) -> bool:
    return bool(_TRANSIENT.search(message))


def split_registry(registry: str) -> tuple[str, str]:
    """'host:5000/team' -> ('host:5000', 'team/'): the API host and the repository prefix."""
    registry = registry.strip().rstrip("/")
    if "@" in registry:  # never echoed: what stands before the '@' is a user name and password
        raise UserError("--registry carries a user name or password, refused: give host[:port][/namespace] and "
                        "log in with `docker login HOST` (credentials come from the Docker config)")
    if not registry or "://" in registry or not _REGISTRY.fullmatch(registry):
        raise UserError(f"registry {one_line(registry)!r}: give host[:port][/namespace], without a scheme")
    host, _, namespace = registry.partition("/")
    return host, (namespace + "/" if namespace else "")


def split_tag(reference: str) -> tuple[str, str]:
    repository, _, tag = reference.rpartition(":")
    if not repository or "/" in tag:
        raise BuildFailure(f"{reference!r} is not repository:tag")
    return repository, tag


# --- the registry's HTTP API, for probing only (the daemon does the transfers) -----------------


def ping(host: str, policy: Policy) -> None:
    """The registry answers /v2/ (401 counts: it is up and wants credentials)."""
    response = api_get(host, "/v2/", None, policy)
    if response.status_code not in (200, 401):
        raise BuildFailure(f"{host} is not a registry: /v2/ answered HTTP {response.status_code}")


def remote_config_digest(host: str, repository: str, tag: str, credentials: registry_auth.Credentials | None,
                         policy: Policy) -> str | None:
    """The image id (config digest) the registry's tag points at; None when the tag is absent; '?'
    when it names a multi-platform index. A registry that wants a login gets one (basic or bearer);
    when it still will not say, the answer is unknown, and that refuses (UserError)."""
    response = get_manifest(host, repository, tag, ACCEPT_MANIFESTS, credentials, policy)
    if response.status_code in (401, 403) and credentials is None:
        raise UserError(f"{host} needs a login to tell whether {repository}:{tag} exists, and "
                        f"{registry_auth.config_path()} has no credentials for it: run `docker login {host}`")
    if response.status_code in (401, 403):
        raise UserError(f"{host} refused the credentials in {registry_auth.config_path()} for reading "
                        f"{repository}:{tag} (HTTP {response.status_code}): run `docker login {host}` again")
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise BuildFailure(f"{host}: reading {repository}:{tag} answered HTTP {response.status_code}")
    manifest = response.json()
    return manifest.get("config", {}).get("digest", "?")


# --- push and pull --------------------------------------------------------------------------


@dataclass(frozen=True)
class Pushed:
    repository: str  # host/repository
    tag: str  # the immutable tag
    manifest_digest: str  # what the registry stored, and the lock records

    @property
    def tagged(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def reference(self) -> str:
        """What a pull by digest names."""
        return f"{self.repository}@{self.manifest_digest}"


@dataclass(frozen=True)
class Pulled:
    reference: str  # host/repository@manifest_digest, as pulled
    image_id: str  # checked against the lock's
    tag: str  # the immutable tag it runs under locally


def push(stack: str, registry: str, *, lock_path: Path, retry: Retry = Retry(),
         client: docker.DockerClient | None = None, engine: StorageEngine | None = None) -> Pushed:
    """Push the stack's immutable tag; record the registry digest in the lock once it is there.
    `engine`: the store pushed from first when it holds the image (the CLI's: buildah's default storage,
    which pushes an image the builder wrote from its OCI layout: publish/engine_push.py); else the
    Docker daemon pushes, or with `client` given, always."""
    found = store.entry(stack, lock_path)
    if found is None:
        raise UserError(f"{stack} is not in matrix.lock: run `builder lock --stack {stack}`")
    image = found.outcome.image
    if image is None:
        raise UserError(f"{stack}: no image recorded in matrix.lock: run `builder build --stack {stack}`")
    if not found.outcome.smoke_passed:
        raise UserError(f"{stack}: image {image.image_id} has not passed smoke; only tested images are pushed")
    host, namespace = split_registry(registry)
    repository, tag = split_tag(image.immutable_tag)
    remote = f"{namespace}{repository}"
    if client is None and engine is not None and engine.holds(image.image_id):
        local_id = image.image_id  # pushed by the engine: no copy into Docker
    elif (client := client or _daemon_holding(image.image_id)) is not None:
        try:
            local_id = client.images.get(image.image_id).id
        except docker.errors.ImageNotFound:
            raise UserError(f"{stack}: image {image.image_id} is not in the Docker daemon: build or pull it") from None
    else:
        raise UserError(f"{stack}: image {image.image_id} is in neither the Docker daemon nor buildah's storage: "
                        "build or pull it")
    credentials = registry_auth.docker_credentials(host)
    policy = transport_policy.load()

    def once() -> str:
        ping(host, policy)
        existing = remote_config_digest(host, remote, tag, credentials, policy)
        if existing not in (None, local_id):
            raise BuildFailure(f"{host}/{remote}:{tag} already names another image ({existing}); "
                               "immutable tags are never moved")
        if client is None:
            return engine_push.push(engine, local_id, f"{host}/{remote}:{tag}", host, credentials, is_transient,
                                    policy)
        client.api.tag(local_id, f"{host}/{remote}", tag)
        return _push_stream(client, f"{host}/{remote}", tag, credentials.for_daemon(host) if credentials else None)

    digest = retry.run(f"push {host}/{remote}:{tag}", once)
    records.record_push(stack, PushRecord(registry=registry, repository=remote, tag=tag, manifest_digest=digest),
                        path=lock_path)
    return Pushed(f"{host}/{remote}", tag, digest)


def _daemon_holding(image_id: str) -> docker.DockerClient | None:
    """The Docker daemon's client when it is up and holds the image (it then pushes), else None."""
    try:
        client = docker_client()
        client.images.get(image_id)
    except (UserError, docker.errors.DockerException):
        return None
    return client


def _push_stream(client: docker.DockerClient, repository: str, tag: str, auth_config: dict | None) -> str:
    digest = None
    try:
        for event in client.api.push(repository, tag=tag, stream=True, decode=True, auth_config=auth_config):
            if "error" in event:
                message = event.get("errorDetail", {}).get("message") or event["error"]
                if is_transient(message):
                    raise TransientError(message)
                raise BuildFailure(f"push {repository}:{tag}: {message}")
            digest = event.get("aux", {}).get("Digest") or digest
    except docker.errors.APIError as error:
        if error.is_server_error() and is_transient(str(error)):
            raise TransientError(_last_line(error)) from None
        raise BuildFailure(f"push {repository}:{tag}: {_last_line(error)}") from None
    except requests.RequestException as error:
        raise TransientError(f"lost the Docker daemon's stream ({reason(error)})") from None
    if not digest:
        raise BuildFailure(f"push {repository}:{tag}: the daemon reported no digest")
    return digest


def pull(stack: str, registry: str | None = None, *, lock_path: Path, retry: Retry = Retry(),
         client: docker.DockerClient | None = None) -> Pulled:
    """Pull the stack's image by the digest the lock recorded at push, and check it is that image."""
    found = store.entry(stack, lock_path)
    if found is None:
        raise UserError(f"{stack} is not in matrix.lock")
    pushed, image = found.outcome.push, found.outcome.image
    if pushed is None or image is None:
        raise UserError(f"{stack}: matrix.lock records no push; run `builder push {stack} --registry R` first")
    host, namespace = split_registry(registry or pushed.registry)
    if registry:
        repository = f"{namespace}{split_tag(image.immutable_tag)[0]}"
    else:
        repository = pushed.repository
    reference = f"{host}/{repository}@{pushed.manifest_digest}"
    client = client or docker_client()
    policy = transport_policy.load()

    def once():
        ping(host, policy)
        try:
            return client.images.pull(reference)
        except docker.errors.NotFound:
            raise BuildFailure(f"{reference} is not in the registry") from None
        except docker.errors.APIError as error:
            if is_transient(str(error)):
                raise TransientError(_last_line(error)) from None
            raise BuildFailure(f"pull {reference}: {_last_line(error)}") from None
        except requests.RequestException as error:
            raise TransientError(f"lost the Docker daemon's stream ({reason(error)})") from None

    pulled = retry.run(f"pull {reference}", once)
    if pulled.id != image.image_id:
        raise BuildFailure(f"{reference} is image {pulled.id}, but matrix.lock records {image.image_id}")
    if reference not in (pulled.attrs.get("RepoDigests") or []):
        raise BuildFailure(f"the daemon does not list {reference} among the pulled image's digests")
    # The names the stack runs under locally, as after a build: compose.yaml runs the moving tag.
    for name in image.tags:
        pulled.tag(*split_tag(name))
    return Pulled(reference, pulled.id, image.immutable_tag)


def _last_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[-1] if lines else type(error).__name__
