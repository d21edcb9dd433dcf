"""A registry base image's tag -> the manifest digest that `FROM image@sha256:...` pins, read from the
registry's HTTP API (GET /v2/<name>/manifests/<tag>).

The digest is of what the tag names: for a multi-platform image its index (manifest list), as
`docker pull` resolves it, so the pin holds on every platform. It is the sha256 of the bytes the
registry sent, checked against the Docker-Content-Digest header where the registry gives one.
A registry that asks for a login (401) gets the one the Docker config holds for it, or an anonymous
token where its challenge is Bearer (Docker Hub, for public images), as transport_policy allows: a
digest is only ever read over TLS, or over plain http from loopback or an insecure-registries host.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass


from builder.errors import UserError
from builder.net import registry_auth, transport_policy
from builder.net.registry_http import ACCEPT_MANIFESTS, MANIFEST_TYPES, Retry, get_manifest
from builder.net.transport_policy import Policy, Refused

# A reference without a registry host means Docker Hub, whose API answers on another host name.
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
RETRY = Retry(failure=UserError)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^\w[\w.-]{0,127}$")


@dataclass(frozen=True)
class BaseImage:
    registry: str  # as `docker login` names it: docker.io, or host[:port]
    repository: str
    tag: str

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry


def parse(image: str) -> BaseImage:
    """'nvidia/cuda:13.0.1-...' or 'host:port/name:tag', read as `docker pull` reads it."""
    if "@" in image:
        raise UserError(f"base {image}: give a tag, not a digest; `builder lock` resolves the digest")
    name, tag = image, "latest"
    if ":" in image.rsplit("/", 1)[-1]:
        name, _, tag = image.rpartition(":")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, name if "/" in name else f"library/{name}"
    if not _REPOSITORY.fullmatch(repository) or not _TAG.fullmatch(tag):
        raise UserError(f"base {image}: not an image reference (registry/name:tag)")
    return BaseImage(registry, repository, tag)


def resolve(image: str, retry: Retry | None = None) -> str:
    """The manifest digest the registry's tag names now; UserError naming the base when it cannot say."""
    base = parse(image)
    credentials = registry_auth.docker_credentials(base.registry)
    policy = transport_policy.load()
    try:
        return (retry or RETRY).run(f"resolving base {image}",
                                    lambda: _manifest_digest(image, base, credentials, policy))
    except Refused as error:
        raise Refused(f"base {image}: {error}") from None


def _manifest_digest(image: str, base: BaseImage, credentials: registry_auth.Credentials | None,
                     policy: Policy) -> str:
    host = base.api_host
    response = get_manifest(host, base.repository, base.tag, ACCEPT_MANIFESTS, credentials, policy)
    status = response.status_code
    if status in (401, 403):
        refused = "refused the credentials in" if credentials else "wants a login, and there is none in"
        raise UserError(f"base {image}: {host} {refused} {registry_auth.config_path()} (HTTP {status}): "
                        f"run `docker login {base.registry}`")
    if status == 404:
        raise UserError(f"base {image}: {host} has no tag {base.tag} in {base.repository} (HTTP 404)")
    if status != 200:
        raise UserError(f"base {image}: {host} answered HTTP {status}")
    media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    if media_type not in MANIFEST_TYPES:
        raise UserError(f"base {image}: {host} answered {media_type or 'no content type'}, not an image manifest")
    digest = "sha256:" + hashlib.sha256(response.content).hexdigest()
    announced = response.headers.get("Docker-Content-Digest")
    if announced and announced != digest:
        raise UserError(f"base {image}: {host} announced {announced} for a manifest whose sha256 is {digest}")
    return digest
