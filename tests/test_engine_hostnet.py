"""Host name entries and the CA bundle reach RUN steps at build time only: never a layer."""

import hashlib
import io
import json
import tarfile
import uuid

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine.protocol import BuildRequest
from builder.engine.buildah import BuildahEngine
from builder.engine.host_network import CA_SECRET_ID, ca_bundle, host_network, parse_hosts

HOSTS = """\
127.0.0.1 localhost
127.0.1.1 vm runsc
::1     localhost ip6-localhost ip6-loopback
fe00::0 ip6-localnet
ff02::1 ip6-allnodes
fe80::1%eth0 linklocal
192.0.2.10   index.internal  mirror.internal # pinned by the host
2001:db8::5  index6.internal
not-an-address broken
"""


def test_parse_hosts_keeps_only_entries_a_container_can_use():
    assert parse_hosts(HOSTS) == (
        "index.internal:192.0.2.10", "index6.internal:2001:db8::5", "mirror.internal:192.0.2.10")


def test_host_network_reads_hosts_file_and_ca_bundle(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    bundle = tmp_path / "bundle.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    network = host_network(hosts)
    assert network.add_hosts[0] == "index.internal:192.0.2.10"
    assert network.secrets == {CA_SECRET_ID: bundle}
    assert host_network(tmp_path / "no-hosts").add_hosts == ()


def test_ca_bundle_prefers_a_named_file_then_falls_back_to_debians_then_to_none(monkeypatch, tmp_path):
    for variable in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(variable, raising=False)
    debians, named = tmp_path / "ca-certificates.crt", tmp_path / "proxy-ca.pem"
    debians.write_text("debian's bundle\n")
    named.write_text("the proxy's CA\n")
    assert ca_bundle(debians) == debians
    assert ca_bundle(tmp_path / "absent.crt") is None
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "missing.pem"))  # named but absent: skipped
    assert ca_bundle(debians) == debians
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(named))
    assert ca_bundle(debians) == named


def layer_files(archive_path):
    """Every regular file of every layer of a docker-archive: (layer, path) -> bytes."""
    files = {}
    with tarfile.open(archive_path) as archive:
        manifest = json.loads(archive.extractfile("manifest.json").read())[0]
        config = archive.extractfile(manifest["Config"]).read()
        for index, member in enumerate(manifest["Layers"]):
            data = archive.extractfile(member).read()
            with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                for entry in layer:
                    if entry.isfile():
                        files[(index, entry.name)] = layer.extractfile(entry).read()
    return config, files


@pytest.mark.engine
@pytest.mark.network
def test_secret_and_host_entries_reach_run_steps_but_no_layer(base_image, tmp_path):
    marker = f"builder-leak-marker-{uuid.uuid4().hex}"
    host_bundle = ca_bundle()
    assert host_bundle is not None, "this test needs the host's CA bundle"
    # The host's real bundle (the package index is reached through it), plus a line no image has.
    secret = tmp_path / "bundle.crt"
    secret.write_bytes(host_bundle.read_bytes() + f"# {marker}\n".encode())
    host_name = f"leaktest-{uuid.uuid4().hex}.invalid"
    host_entry = f"{host_name}:192.0.2.123"
    # The RUN step checks both by pattern only: its command line is kept in the image history,
    # so it must not spell out the marker, the name or the address searched for below.
    context = write_context(tmp_path / "ctx", f"""\
FROM {TEST_BASE_TAG}
ARG SOURCE_DATE_EPOCH
RUN python3 -m venv /opt/venv
RUN --mount=type=secret,id=cacert tail -n 1 /run/secrets/cacert | grep -q '^# builder-leak-marker-' \\
 && awk '$2 ~ /^leaktest-/ && $1 ~ /^192[.]0[.]2[.]/' /etc/hosts | grep -q . \\
 && PIP_CERT=/run/secrets/cacert /opt/venv/bin/pip download --no-deps --dest /opt/wheels six==1.16.0
""")
    engine = BuildahEngine(storage_dir=tmp_path / "storage", export_to_docker=False)
    engine.load(base_image.archive)
    network = host_network()
    # The engine's own build: the builder's (write-once) build runs every step with no network at all.
    image_id = engine.build_native(BuildRequest(
        context_dir=context, dockerfile=context / "Dockerfile", tags=["localhost/leak-test:1"],
        source_date_epoch=EPOCH, secrets={CA_SECRET_ID: secret},
        add_hosts=network.add_hosts + (host_entry,),
    ))
    archive = tmp_path / "image.tar"
    engine.save(image_id, archive)
    engine.reset_storage()
    config, files = layer_files(archive)
    # The build really used both: the wheel came through the CA secret.
    assert any(path.endswith("six-1.16.0-py2.py3-none-any.whl") for _, path in files)
    secret_digest = hashlib.sha256(secret.read_bytes()).digest()
    needles = [marker.encode(), host_name.encode(), b"192.0.2.123"]
    for (layer, path), data in files.items():
        for needle in needles:
            assert needle not in data, f"{needle!r} left in layer {layer}: {path}"
        assert hashlib.sha256(data).digest() != secret_digest, f"CA bundle left in layer {layer}: {path}"
    for needle in needles:
        assert needle not in config, f"{needle!r} left in the image config"
    assert not any(path.lstrip("./").startswith("run/secrets/") and data for (_, path), data in files.items())
