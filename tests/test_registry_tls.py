"""Registry traffic to a host that is not loopback, on real servers: a network namespace of the test's own
with a veth pair, the registry stand-in (tests/netns_registry.py) inside it on a 10.x address that the
host side of the veth routes to, recording every request. It speaks plain http (TLS to it fails) and
answers 401 with Basic and Bearer challenges; one port speaks TLS with a self-signed certificate.

`builder lock` (the base digest of a row whose base names that host) and `builder push` run as
commands here, outside the namespace, with the login for that host in their Docker config: they send
nothing over plain http, exit 2 with one line, and leave matrix.lock byte for byte as it was. Listed
in the daemon's insecure-registries, the host gets plain http, and still no login. Over TLS with a
certificate the CA bundle trusts, the login goes and the digest is locked."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.config.matrix import load_matrix
from builder.errors import UserError
from builder.lock import store
from builder.lock import base_digest
from builder.net.registry_http import Retry
from loopback_debian import DebianMirror, Signer, real_debs
from loopback_index import ROW_SYSTEM_PACKAGES, LoopbackServer, cu130_env, cu130_project
from netns_registry import MANIFEST
from checkouts import REPO, link_project_files, run_builder
from registries import free_port

USER, PASSWORD = "builder", "s3cret-passw0rd"
LOGIN = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
CU128 = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")
BASE_PATH = "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
# The stand-in's ports: 443 and 80 as a registry without a port is reached; the rest explicit.
BASIC, BEARER, TOKEN_SERVICE, TLS = 5000, 5002, 5001, 5443


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


@dataclass(frozen=True)
class Namespace:
    name: str
    address: str  # inside the namespace, where the stand-in listens
    network: str  # the veth pair's /30


def _free_subnet() -> int:
    """A third octet n for 10.213.n.0/30 that no route on this host uses."""
    routes = ip("-4", "route", "show", "table", "all").stdout
    for n in range(os.getpid() % 200, os.getpid() % 200 + 50):
        if f"10.213.{n}." not in routes:
            return n
    raise AssertionError("no free 10.213.n.0/30")


@pytest.fixture(scope="module")
def netns():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes a network namespace and a veth pair")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's ip")
    name, tag = f"builder-tls-{os.getpid()}", f"bt{os.getpid() % 100000}"
    made = ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"no network namespace support here: {made.stderr.strip()}")
    outside, inside = f"{tag}h", f"{tag}n"
    try:
        n = _free_subnet()
        for command in (["link", "add", outside, "type", "veth", "peer", "name", inside, "netns", name],
                        ["addr", "add", f"10.213.{n}.1/30", "dev", outside],
                        ["link", "set", outside, "up"],
                        ["-n", name, "addr", "add", f"10.213.{n}.2/30", "dev", inside],
                        ["-n", name, "link", "set", inside, "up"],
                        ["-n", name, "link", "set", "lo", "up"]):
            done = ip(*command)
            assert done.returncode == 0, (command, done.stderr)
        yield Namespace(name, f"10.213.{n}.2", f"10.213.{n}.0/30")
    finally:
        ip("netns", "del", name)  # takes the veth pair with it
        ip("link", "del", outside)


class StandIn:
    """tests/netns_registry.py running in the namespace; `requests()` reads what it recorded."""

    def __init__(self, netns: Namespace, folder: Path):
        self.address, self.log = netns.address, folder / "requests.jsonl"
        self.certificate, key = folder / "cert.pem", folder / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(self.certificate), "-days", "2", "-subj", f"/CN={self.address}",
                        "-addext", f"subjectAltName=IP:{self.address}"], check=True, capture_output=True)
        realm = f'Bearer realm="http://{self.address}:{TOKEN_SERVICE}/token",service="netns"'
        basic = 'Basic realm="netns"'
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", netns.name, sys.executable, str(Path(__file__).parent / "netns_registry.py"),
             str(self.log), "--listen", "443", basic, "--listen", "80", basic, "--listen", str(BASIC), basic,
             "--listen", str(BEARER), realm, "--listen", str(TOKEN_SERVICE), "token",
             "--tls", str(TLS), str(self.certificate), str(key)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline() == "ready\n"

    def requests(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(10)


@pytest.fixture(scope="module")
def stand_in(netns, tmp_path_factory):
    server = StandIn(netns, tmp_path_factory.mktemp("netns-registry"))
    yield server
    server.stop()


@pytest.fixture
def seen(stand_in):
    """What the stand-in records during one test."""
    before = len(stand_in.requests())
    return lambda: stand_in.requests()[before:]


def configs(folder: Path, host: str, insecure: list[str]) -> dict:
    """DOCKER_CONFIG holding the login for `host` (as `docker login` writes it), and a daemon.json
    listing `insecure`, as the environment of a builder command."""
    (folder / "docker-config").mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (folder / "docker-config" / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    (folder / "daemon.json").write_text(json.dumps({"insecure-registries": insecure}))
    return {"DOCKER_CONFIG": str(folder / "docker-config"), "BUILDER_DOCKER_DAEMON_CONFIG": str(folder / "daemon.json")}


def no_login_sent(requests: list[dict]) -> bool:
    return not any("authorization" in {key.lower() for key in r.get("headers", {})} for r in requests)


# ---- builder lock: the base digest of a row whose base names the namespace's host ----------------


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The CUDA 13 row with every wheel source on loopback (tests/loopback_index.py); each test points
    its base at the namespace's host."""
    server = LoopbackServer(tmp_path_factory.mktemp("sources"))
    # The row's system packages from Debian's archive on loopback (real .debs, a key made here): the
    # control test locks the whole row once the base digest is allowed through.
    signer = Signer(tmp_path_factory.mktemp("signer"))
    mirror = DebianMirror(server, signer)
    mirror.publish(real_debs(ROW_SYSTEM_PACKAGES), "Thu, 01 Jan 2026 00:00:00 UTC")
    yield cu130_project(tmp_path_factory.mktemp("project"), server, "registry.invalid",
                        (mirror.source_line, signer.keyring))
    server.stop()


def lock_run(project, folder: Path, host: str, insecure: list[str], extra_env: dict | None = None):
    """`builder lock` of the row with its base on `host`, in `folder` holding a copy of the committed
    lock; (the command's result, the lock's bytes before, the lock file)."""
    folder.mkdir(parents=True, exist_ok=True)
    link_project_files(folder)
    matrix = folder / "matrix.toml"
    matrix.write_text(project.matrix.read_text().replace(project.base_image, f"{host}/{BASE_PATH}"))
    lock_file = folder / "matrix.lock"
    shutil.copy(REPO / "matrix.lock", lock_file)
    before = lock_file.read_bytes()
    env = {**cu130_env(project), **configs(folder, host, insecure), **(extra_env or {})}
    result = run_builder("lock", "--matrix", str(matrix), "--stack", project.stack, env=env, timeout=600)
    return result, before, lock_file


@pytest.mark.parametrize("port", ["", f":{BASIC}", f":{BEARER}"], ids=["default-ports", "basic", "bearer"])
def test_lock_refuses_a_host_whose_tls_fails_and_sends_nothing_over_http(project, stand_in, seen, tmp_path, port):
    host = f"{stand_in.address}{port}"
    result, before, lock_file = lock_run(project, tmp_path, host, insecure=[])
    requests = seen()
    assert no_login_sent(requests)
    assert requests and all(r.get("tls_hello") for r in requests), requests  # TLS was tried, http never
    assert {r["port"] for r in requests} == {int(port[1:]) if port else 443}
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"builder: error: {project.stack}: base {host}/{BASE_PATH}: registry {host}: TLS failed (wrong version "
        f"number); not retried over http: plain http goes only to loopback and to the insecure-registries of "
        f"{tmp_path}/daemon.json; nothing was locked\n")
    assert lock_file.read_bytes() == before
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("port, refusal", [
    ("", "registry {host} asks for the login over plain http, and credentials go over plain http only to "
         "loopback: serve it over TLS"),
    (f":{BEARER}", "registry {host} names the token service http://{address}:5001/token, and credentials go "
                   "over plain http only to loopback"),
], ids=["basic", "bearer"])
def test_lock_speaks_http_to_an_insecure_registry_but_never_sends_the_login(project, stand_in, seen, tmp_path,
                                                                            netns, port, refusal):
    """Listed in insecure-registries (as a CIDR), the host is asked over plain http, after TLS failed."""
    host = f"{stand_in.address}{port}"
    result, before, lock_file = lock_run(project, tmp_path, host, insecure=[netns.network])
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"builder: error: {project.stack}: base {host}/{BASE_PATH}: "
                             f"{refusal.format(host=host, address=stand_in.address)}; nothing was locked\n")
    assert lock_file.read_bytes() == before
    requests = seen()
    over_http = [r for r in requests if "method" in r]
    assert [(r["port"], r["method"], r["path"]) for r in over_http] == [
        (int(port[1:]) if port else 80, "GET", "/v2/nvidia/cuda/manifests/13.0.1-cudnn-devel-ubuntu24.04")]
    assert no_login_sent(requests)
    assert not any(r["port"] == TOKEN_SERVICE for r in requests)


def test_lock_refuses_a_certificate_the_ca_bundle_does_not_trust(project, stand_in, seen, tmp_path):
    host = f"{stand_in.address}:{TLS}"
    result, before, lock_file = lock_run(project, tmp_path, host, insecure=[])
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"builder: error: {project.stack}: base {host}/{BASE_PATH}: registry {host}: TLS failed (certificate "
        f"verify failed: self-signed certificate); not retried over http: plain http goes only to loopback and "
        f"to the insecure-registries of {tmp_path}/daemon.json; nothing was locked\n")
    assert lock_file.read_bytes() == before
    assert seen() == []  # the handshake failed: no request was made


def test_over_trusted_tls_the_login_goes_and_the_digest_is_locked(project, stand_in, seen, tmp_path):
    """The control: the same command, the certificate in the CA bundle. The lock now changes."""
    host = f"{stand_in.address}:{TLS}"
    result, before, lock_file = lock_run(project, tmp_path, host, insecure=[],
                                         extra_env={"REQUESTS_CA_BUNDLE": str(stand_in.certificate)})
    assert result.returncode == 0, result.stderr
    base = store.entry(project.stack, lock_file).resolution.base
    assert base.manifest_digest == "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
    assert lock_file.read_bytes() != before
    requests = seen()
    assert [(r["over_tls"], r["headers"].get("Authorization")) for r in requests] == [(True, None), (True, LOGIN)]
    assert PASSWORD not in lock_file.read_text() + result.stdout + result.stderr


# ---- builder push: the probe that reads the immutable tag before the daemon pushes ----------------


@pytest.mark.engine
@pytest.mark.parametrize("port", ["", f":{BASIC}", f":{BEARER}"], ids=["default-ports", "basic", "bearer"])
def test_push_refuses_a_host_whose_tls_fails_and_sends_nothing_over_http(stand_in, seen, image, cu128_lock,
                                                                         record_cu128, tmp_path, port):
    host = f"{stand_in.address}{port}"
    record_cu128(cu128_lock, image)
    before = cu128_lock.read_bytes()
    env = {**os.environ, **configs(tmp_path, host, insecure=[])}
    result = run_builder("push", CU128.name, "--registry", host, env=env)
    requests = seen()
    assert no_login_sent(requests)
    assert requests and all(r.get("tls_hello") for r in requests), requests
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"builder: error: registry {host}: TLS failed (wrong version number); not retried over http: plain http "
        f"goes only to loopback and to the insecure-registries of {tmp_path}/daemon.json\n")
    assert cu128_lock.read_bytes() == before
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.engine
@pytest.mark.parametrize("port, refusal", [
    ("", "registry {host} asks for the login over plain http, and credentials go over plain http only to "
         "loopback: serve it over TLS"),
    # Listed by name, the registry's host:port is; its token service on another port is not.
    (f":{BEARER}", "registry {host} names the token service http://{address}:5001/token: plain http goes only to "
                   "loopback and to the insecure-registries of {config}"),
], ids=["basic", "bearer"])
def test_push_speaks_http_to_an_insecure_registry_but_never_sends_the_login(stand_in, seen, image, cu128_lock,
                                                                            record_cu128, tmp_path, netns,
                                                                            port, refusal):
    host = f"{stand_in.address}{port}"
    record_cu128(cu128_lock, image)
    before = cu128_lock.read_bytes()
    env = {**os.environ, **configs(tmp_path, host, insecure=[host])}  # listed by name, as dockerd matches it
    result = run_builder("push", CU128.name, "--registry", host, env=env)
    assert result.returncode == 2, result.stderr
    config = tmp_path / "daemon.json"
    assert result.stderr == f"builder: error: {refusal.format(host=host, address=stand_in.address, config=config)}\n"
    assert cu128_lock.read_bytes() == before
    requests = seen()
    over_http = [(r["method"], r["path"]) for r in requests if "method" in r]
    assert over_http == [("GET", "/v2/"), ("GET", f"/v2/{image['repository']}/manifests/0.5.9-cu128-abc123")]
    assert no_login_sent(requests)


# ---- redirects: never down to plain http to a host that is not allowed, never the login elsewhere ----


class Redirector:
    """A registry stand-in on loopback: 401 with a Basic challenge to a request without a login, a 307
    to `target` to one with it, 404 when `target` is None; every request's headers recorded."""

    def __init__(self, target: str | None = None):
        self.target, self.requests = target, []
        this = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                this.requests.append(dict(self.headers.items()))
                if "Authorization" not in self.headers and this.target:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="loopback"')
                elif this.target:
                    self.send_response(307)
                    self.send_header("Location", this.target)
                else:
                    self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def resolving(tmp_path, monkeypatch):
    """base_digest.resolve with the login for `host` in the Docker config and no insecure registries."""

    def resolve(host: str) -> str:
        for key, value in configs(tmp_path, host, insecure=[]).items():
            monkeypatch.setenv(key, value)
        return base_digest.resolve(f"{host}/{BASE_PATH}", Retry(1, 0, lambda _: None, UserError))

    return resolve


def test_a_redirect_down_to_plain_http_elsewhere_is_refused(stand_in, seen, resolving, tmp_path):
    target = f"http://{stand_in.address}/v2/nvidia/cuda/manifests/13.0.1-cudnn-devel-ubuntu24.04"
    origin = Redirector(target)
    try:
        with pytest.raises(UserError) as refused:
            resolving(origin.host)
    finally:
        origin.stop()
    assert str(refused.value) == (f"base {origin.host}/{BASE_PATH}: {target}: plain http goes only to loopback and "
                                  f"to the insecure-registries of {tmp_path}/daemon.json")
    assert [r.get("Authorization") for r in origin.requests] == [None, LOGIN]  # loopback may have it
    assert seen() == []


def test_a_redirect_to_another_origin_carries_no_login(resolving):
    elsewhere = Redirector()
    origin = Redirector(f"http://{elsewhere.host}/v2/nvidia/cuda/manifests/13.0.1-cudnn-devel-ubuntu24.04")
    try:
        with pytest.raises(UserError) as missing:
            resolving(origin.host)
    finally:
        origin.stop()
        elsewhere.stop()
    assert str(missing.value).endswith("has no tag 13.0.1-cudnn-devel-ubuntu24.04 in nvidia/cuda (HTTP 404)")
    assert [r.get("Authorization") for r in origin.requests] == [None, LOGIN]
    assert len(elsewhere.requests) == 1 and "Authorization" not in elsewhere.requests[0]
