"""The transport policy on its own: which hosts get plain http, and how each 401 may be answered, for
every host kind x scheme x challenge, with and without a login in the Docker config; and the daemon
configuration the insecure registries come from."""

from __future__ import annotations

import json

import pytest

from builder.errors import UserError
from builder.net import transport_policy
from builder.net.transport_policy import Kind, Login, Policy, Refused

POLICY = Policy.from_entries(["http://registry.lan:5000", "10.9.0.0/24"], "/etc/docker/daemon.json")

HOSTS = {  # label -> a registry host of that kind
    "loopback-v4": "127.0.0.5:5000",
    "loopback-v6": "[::1]:5000",
    "localhost": "localhost:5000",
    "listed-name": "registry.lan:5000",
    "listed-cidr": "10.9.0.7:5000",
    "other": "registry.example.com",
}


def challenges(host: str) -> dict[str, str]:
    scope = 'service="reg",scope="repository:team/cuda:pull"'
    return {
        "none": "",
        "basic": 'Basic realm="registry"',
        "bearer-https-realm": f'Bearer realm="https://{host}/token",{scope}',
        "bearer-http-realm": f'Bearer realm="http://{host}/token",{scope}',
        "bearer-https-foreign": f'Bearer realm="https://auth.example.net/token",{scope}',
        "bearer-http-foreign": f'Bearer realm="http://auth.example.net/token",{scope}',
    }


# The whole table, written out. Columns: the challenges above, in order. "-": no login is sent (the
# 401 stands); basic: the login as a Basic header; token: a token asked with the login; anon: a token
# asked without one; NO: refused, nothing is sent.
WITH_LOGIN = {
    ("loopback-v4", "https"): "-  basic token token token NO",
    ("loopback-v4", "http"): "-  basic token token token NO",
    ("loopback-v6", "https"): "-  basic token token token NO",
    ("loopback-v6", "http"): "-  basic token token token NO",
    ("localhost", "https"): "-  basic token token token NO",
    ("localhost", "http"): "-  basic token token token NO",
    ("listed-name", "https"): "-  basic token NO    token NO",
    ("listed-name", "http"): "-  NO    NO    NO    NO    NO",
    ("listed-cidr", "https"): "-  basic token NO    token NO",
    ("listed-cidr", "http"): "-  NO    NO    NO    NO    NO",
    ("other", "https"): "-  basic token NO    token NO",
    ("other", "http"): "NO NO    NO    NO    NO    NO",
}
WITHOUT_LOGIN = {
    ("loopback-v4", "https"): "-  - anon anon anon NO",
    ("loopback-v4", "http"): "-  - anon anon anon NO",
    ("loopback-v6", "https"): "-  - anon anon anon NO",
    ("loopback-v6", "http"): "-  - anon anon anon NO",
    ("localhost", "https"): "-  - anon anon anon NO",
    ("localhost", "http"): "-  - anon anon anon NO",
    ("listed-name", "https"): "-  - anon anon anon NO",
    ("listed-name", "http"): "-  - anon anon anon NO",
    ("listed-cidr", "https"): "-  - anon anon anon NO",
    ("listed-cidr", "http"): "-  - anon anon anon NO",
    ("other", "https"): "-  - anon NO   anon NO",
    ("other", "http"): "NO NO NO  NO   NO   NO",
}


def outcome(host: str, scheme: str, challenge: str, has_credentials: bool) -> str:
    try:
        login = transport_policy.login_for(host, scheme, challenge, has_credentials, POLICY)
    except Refused:
        return "NO"
    if login.method == "token":
        return "token" if login.with_credentials else "anon"
    assert not login.with_credentials or login.method == "basic"
    return {"none": "-", "basic": "basic"}[login.method]


@pytest.mark.parametrize("has_credentials, table", [(True, WITH_LOGIN), (False, WITHOUT_LOGIN)],
                         ids=["with-login", "without-login"])
@pytest.mark.parametrize("label", HOSTS)
@pytest.mark.parametrize("scheme", ["https", "http"])
def test_the_policy_table(label, scheme, has_credentials, table):
    host = HOSTS[label]
    got = [outcome(host, scheme, challenge, has_credentials) for challenge in challenges(host).values()]
    assert got == table[label, scheme].split(), dict(zip(challenges(host), got))


@pytest.mark.parametrize("host, kind", [
    ("127.0.0.1:5000", Kind.LOOPBACK), ("127.200.3.4", Kind.LOOPBACK), ("[::1]:5000", Kind.LOOPBACK),
    ("::1", Kind.LOOPBACK), ("localhost", Kind.LOOPBACK), ("LOCALHOST:5000", Kind.LOOPBACK),
    ("registry.lan:5000", Kind.INSECURE), ("Registry.LAN:5000", Kind.INSECURE),
    ("10.9.0.7:5000", Kind.INSECURE), ("10.9.0.255", Kind.INSECURE),
    # A name is listed with its port, as dockerd matches it; a CIDR holds addresses, never names.
    ("registry.lan", Kind.TLS_ONLY), ("registry.lan:5001", Kind.TLS_ONLY), ("10.9.1.7:5000", Kind.TLS_ONLY),
    ("128.0.0.1", Kind.TLS_ONLY), ("localhost.example.com", Kind.TLS_ONLY), ("[::2]:5000", Kind.TLS_ONLY),
    ("registry-1.docker.io", Kind.TLS_ONLY), ("192.0.2.2:5000", Kind.TLS_ONLY),
])
def test_host_kinds(host, kind):
    assert POLICY.kind(host) is kind


def test_plain_http_is_tried_only_where_allowed():
    assert transport_policy.schemes(Kind.LOOPBACK) == ("https", "http")
    assert transport_policy.schemes(Kind.INSECURE) == ("https", "http")
    assert transport_policy.schemes(Kind.TLS_ONLY) == ("https",)


def test_a_token_login_names_its_realm_and_scope():
    assert transport_policy.login_for(
        "registry.example.com", "https",
        'Bearer realm="https://auth.example.net/token",service="reg",scope="repository:a:pull"', True, POLICY,
    ) == Login("token", True, "https://auth.example.net/token", (("service", "reg"), ("scope", "repository:a:pull")))


@pytest.mark.parametrize("host, scheme, challenge, message", [
    ("registry.example.com", "http", 'Basic realm="r"',
     "registry registry.example.com is TLS only: plain http goes only to loopback and to the insecure-registries "
     "of /etc/docker/daemon.json"),
    ("10.9.0.7:5000", "http", 'Basic realm="r"',
     "registry 10.9.0.7:5000 asks for the login over plain http, and credentials go over plain http only to "
     "loopback: serve it over TLS"),
    ("registry.example.com", "https", 'Bearer realm="http://auth.example.net/token"',
     "registry registry.example.com names the token service http://auth.example.net/token: plain http goes only "
     "to loopback and to the insecure-registries of /etc/docker/daemon.json"),
    ("registry.example.com", "https", 'Bearer realm="http://127.0.0.1/token"',
     "registry registry.example.com names the token service http://127.0.0.1/token: a realm must be https "
     "unless the registry is loopback or in the insecure-registries of /etc/docker/daemon.json"),
    ("10.9.0.7:5000", "https", 'Bearer realm="http://10.9.0.7:5000/token"',
     "registry 10.9.0.7:5000 names the token service http://10.9.0.7:5000/token, and credentials go over plain "
     "http only to loopback"),
    ("10.9.0.7:5000", "http", 'Bearer realm="https://auth.example.net/token"',
     "registry 10.9.0.7:5000 speaks plain http, and a token bought with the login goes over plain http only to "
     "loopback: serve it over TLS"),
    ("127.0.0.1:5000", "http", 'Bearer realm="file:///etc/passwd"',
     "registry 127.0.0.1:5000 names the token service file:///etc/passwd: not an http(s) URL"),
])
def test_refusals_are_one_line_naming_the_host(host, scheme, challenge, message):
    with pytest.raises(Refused) as refused:
        transport_policy.login_for(host, scheme, challenge, True, POLICY)
    assert str(refused.value) == message


def test_the_daemon_configuration_lists_the_insecure_registries(tmp_path, monkeypatch):
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps({"insecure-registries": ["registry.lan:5000", "https://10.1.2.0/24", "fd00::/64"],
                                  "log-driver": "json-file"}))
    monkeypatch.setenv(transport_policy.DAEMON_CONFIG_ENV, str(config))
    policy = transport_policy.load()
    assert policy.source == str(config)
    assert [policy.kind(h) for h in ("registry.lan:5000", "10.1.2.9", "[fd00::7]:5000", "10.1.3.9")] == \
        [Kind.INSECURE, Kind.INSECURE, Kind.INSECURE, Kind.TLS_ONLY]


def test_without_a_daemon_configuration_only_loopback_gets_plain_http(tmp_path, monkeypatch):
    monkeypatch.setenv(transport_policy.DAEMON_CONFIG_ENV, str(tmp_path / "absent.json"))
    policy = transport_policy.load()
    assert (policy.kind("127.0.0.1:5000"), policy.kind("10.9.0.7:5000")) == (Kind.LOOPBACK, Kind.TLS_ONLY)
    (tmp_path / "empty.json").write_text("{}")
    assert transport_policy.load(str(tmp_path / "empty.json")).kind("registry.lan:5000") is Kind.TLS_ONLY


@pytest.mark.parametrize("text, message", [
    ("{not json", "cannot read the Docker daemon's configuration {path}: Expecting property name"),
    ("[]", "{path}: not a JSON object"),
    ('{"insecure-registries": "registry.lan"}', "{path}: insecure-registries must be a list of strings"),
    ('{"insecure-registries": ["ftp://registry.lan"]}',
     "{path}: insecure-registries entry 'ftp://registry.lan' is neither host[:port] nor a CIDR"),
    ('{"insecure-registries": ["registry.lan/team"]}',
     "{path}: insecure-registries entry 'registry.lan/team' is neither host[:port] nor a CIDR"),
    ('{"insecure-registries": [""]}', "{path}: insecure-registries entry '' is neither host[:port] nor a CIDR"),
])
def test_a_bad_daemon_configuration_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "daemon.json"
    path.write_text(text)
    with pytest.raises(UserError) as bad:
        transport_policy.load(str(path))
    assert str(bad.value).startswith(message.format(path=path))
    assert "\n" not in str(bad.value)
