"""`entrypoint health`: one GET of the server's /health, the container's health check.

    healthcheck: ["CMD", "/opt/venv/bin/python", "-m", "builder.runtime.serve.entrypoint", "health"]

SGLang answers /health with 503 while it loads and warms up, and with 200 once it can generate
(the request then generates one token). Exit 0 on 200, else 1 with one line saying why: the
status, the connection error or the timeout.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

DEFAULT_TIMEOUT_S = 5.0
# SGLang's default port; compose files pass the profile's with --port.
DEFAULT_PORT = 30000

# The server is in this container: a proxy from the environment (http_proxy) must never carry the probe.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str | None:
    """None when GET `url` answers 200; otherwise why not, in one line."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        return f"GET {url} answered HTTP {error.code}"
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            return f"GET {url}: no answer within {timeout_s:g} s"
        return f"GET {url} failed: {error.reason}"
    except TimeoutError:
        return f"GET {url}: no answer within {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as error:
        return f"GET {url} failed: {error.__class__.__name__}: {error}"
    if status != 200:
        return f"GET {url} answered HTTP {status}"
    return None
