"""A plain-http registry stand-in that records every request, for tests/test_registry_tls.py, which runs it
inside a network namespace (`ip netns exec NS python netns_registry.py ...`).

    netns_registry.py LOG [--listen PORT CHALLENGE]... [--tls PORT CERT KEY]...

Each `--listen` port answers every HTTP request with 401 and `WWW-Authenticate: CHALLENGE`, except that
CHALLENGE `token` makes the port a token service (200, {"token": "netns-token"}). A connection that
opens with a TLS ClientHello gets the "400 Bad Request" a plain-http server sends, so the client's TLS
fails as it does against any plain-http registry. Each `--tls` port speaks TLS with CERT and KEY and
answers like a `--listen` port with a Basic challenge, and with a manifest once a request carries an
Authorization header. Every request goes to LOG as a JSON line: the port, whether it came over TLS,
and either `"tls_hello": true` or the method, path and headers. "ready" on stdout once all ports listen.
"""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import ssl
import sys
import threading

MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": "sha256:" + "0" * 64, "size": 2}, "layers": []}).encode()


def serve(port: int, challenge: str, log, lock: threading.Lock, tls: ssl.SSLContext | None = None):
    def record(entry: dict) -> None:
        with lock:
            log.write(json.dumps({"port": port, "over_tls": tls is not None, **entry}) + "\n")
            log.flush()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):
            pass

        def handle(self):
            if tls is None and self.request.recv(2, socket.MSG_PEEK) == b"\x16\x03":
                record({"tls_hello": True})
                self.request.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            super().handle()

        def _answer(self):
            record({"method": self.command, "path": self.path, "headers": dict(self.headers.items())})
            if challenge == "token":
                self._send(200, {"Content-Type": "application/json"}, b'{"token": "netns-token"}')
            elif tls is not None and "Authorization" in self.headers:
                self._send(200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, MANIFEST)
            else:
                self._send(401, {"WWW-Authenticate": challenge}, b"")

        def _send(self, status: int, headers: dict, body: bytes):
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _answer

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--listen", nargs=2, action="append", default=[], metavar=("PORT", "CHALLENGE"))
    parser.add_argument("--tls", nargs=3, action="append", default=[], metavar=("PORT", "CERT", "KEY"))
    args = parser.parse_args()
    log, lock = open(args.log, "a", encoding="utf-8"), threading.Lock()
    for port, challenge in args.listen:
        serve(int(port), challenge, log, lock)
    for port, cert, key in args.tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        serve(int(port), 'Basic realm="netns"', log, lock, context)
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes stdin


if __name__ == "__main__":
    main()
