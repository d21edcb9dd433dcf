"""Real registries for the push, pull and login tests: Debian's docker-registry as a process or an
image, and a JWT token issuer for Bearer login."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import re
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import urllib.parse
from pathlib import Path

import requests


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def registry_binary() -> str:
    binary = shutil.which("docker-registry") or shutil.which("registry")
    assert binary, "docker-registry is not installed (scripts/setup-host installs it)"
    return binary


def registry_image(client) -> str:
    """Debian's docker-registry as a container image, for tests/compose/registry.yaml: the binary and
    the libraries the loader gives it (ldd), imported as one layer, tagged by the binary's sha256."""
    binary = Path(registry_binary()).resolve()
    tag = f"builder-test-registry:{hashlib.sha256(binary.read_bytes()).hexdigest()[:12]}"
    listing = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    libraries = re.findall(r"(?:=> )?(/\S+) \(0x", listing)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(str(binary), arcname="usr/bin/docker-registry")
        for library in libraries:
            archive.add(str(Path(library).resolve()), arcname=library.lstrip("/"))
    client.api.import_image_from_data(buffer.getvalue(), repository=tag.split(":")[0], tag=tag.split(":")[1])
    return tag


class Registry:
    """docker-registry on 127.0.0.1:port, file storage in a temporary folder; no auth, basic auth
    against an htpasswd file, or token auth (Bearer) with tokens from a TokenIssuer. `start` runs it
    as a process; tests/compose/registry.yaml runs it as a compose service from `config`."""

    def __init__(self, root: Path, port: int, htpasswd: Path | None = None, token: "TokenIssuer | None" = None,
                 log_level: str = "error"):
        self.root, self.port, self.process, self.htpasswd, self.token = root, port, None, htpasswd, token
        self.log_level = log_level  # "info" logs every request answered, for the tests that count them
        self.host = f"127.0.0.1:{port}"

    def config(self, seen_as: Path | None = None) -> str:
        """Distribution's config.yml. `seen_as`: where a container mounts `root`, which then holds every
        file the config names; None: the registry runs here, as a process listening on `host`."""
        def path(local: Path) -> Path:
            return seen_as / local.relative_to(self.root) if seen_as else local

        auth = ""
        if self.htpasswd:
            auth = f"auth:\n  htpasswd:\n    realm: builder-test\n    path: {path(self.htpasswd)}\n"
        elif self.token:
            auth = (f"auth:\n  token:\n    realm: {self.token.realm}\n    service: {self.token.service}\n"
                    f"    issuer: {self.token.issuer}\n    rootcertbundle: {path(self.token.certificate)}\n")
        return ("version: 0.1\n"
                f"log:\n  level: {self.log_level}\n"
                f"storage:\n  filesystem:\n    rootdirectory: {path(self.root / 'data')}\n  delete:\n    enabled: true\n"
                f"http:\n  addr: {'0.0.0.0:5000' if seen_as else self.host}\n"
                + auth)

    def responds(self) -> bool:
        try:
            return requests.get(f"http://{self.host}/v2/", timeout=1).status_code in (200, 401)
        except requests.RequestException:
            return False

    def start(self) -> None:
        config = self.root / "config.yml"
        config.write_text(self.config())
        self.log = open(self.root / "registry.log", "ab")
        self.process = subprocess.Popen([registry_binary(), "serve", str(config)], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.responds():
                return
            time.sleep(0.1)
        raise AssertionError(f"registry did not start: {(self.root / 'registry.log').read_text()}")

    def stop(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(10)
            self.log.close()
            self.process = None

    def manifest_digest(self, repository: str, tag: str) -> str:
        response = requests.head(
            f"http://{self.host}/v2/{repository}/manifests/{tag}", timeout=10,
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                               "application/vnd.oci.image.manifest.v1+json"})
        response.raise_for_status()
        return response.headers["Docker-Content-Digest"]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenIssuer:
    """A token service as Docker Hub and Distribution's token auth speak it, on 127.0.0.1: GET /token
    with HTTP basic credentials answers {"token": JWT} for the asked scope (with `anonymous_pull`, one
    without credentials gets a token for pulling only); the JWT is RS256-signed
    (openssl) with its certificate in the x5c header, which the registry checks against the bundle."""

    service, issuer = "builder-test-registry", "builder-test-issuer"

    def __init__(self, directory: Path, port: int, user: str, password: str, anonymous_pull: bool = False):
        directory.mkdir(parents=True, exist_ok=True)
        self.key, self.certificate = directory / "token.key", directory / "token.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key),
                        "-out", str(self.certificate), "-days", "2", "-subj", "/CN=builder-test-token"],
                       check=True, capture_output=True)
        der = subprocess.run(["openssl", "x509", "-in", str(self.certificate), "-outform", "DER"],
                             check=True, capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.realm = f"http://127.0.0.1:{port}/token"
        self.requests: list[str] = []
        issuer, expected = self, "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                issuer.requests.append(self.path)
                # Docker Hub's way with public images: a pull-only token for whoever asks without a login.
                anonymous = anonymous_pull and "Authorization" not in self.headers
                if url.path != "/token" or (self.headers.get("Authorization") != expected and not anonymous):
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"token": issuer.sign(query.get("scope", []), pull_only=anonymous)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def sign(self, scopes: list[str], pull_only: bool = False) -> str:
        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":", 2) if scope.count(":") >= 2 else (scope, "", "")
            granted = [a for a in actions.split(",") if a and (a == "pull" or not pull_only)]
            access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {"iss": self.issuer, "sub": "builder", "aud": self.service, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": f"{now}-{len(self.requests)}", "access": access}
        signing_input = _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(claims).encode())
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=signing_input.encode(),
                                   check=True, capture_output=True).stdout
        return signing_input + "." + _b64url(signature)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
