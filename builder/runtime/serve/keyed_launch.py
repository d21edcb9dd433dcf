"""Run sglang.launch_server with `--api-key` added inside this process.

    python -m builder.runtime.serve.keyed_launch SERVER-ARGS...

The key comes from SERVE_API_KEY_FILE or SERVE_API_KEY (builder.runtime.serve.api_key). It joins
sys.argv here, after the exec, so the command line other processes can read (/proc/PID/cmdline)
never holds it, and both variables leave the environment before SGLang starts its workers.
"""

from __future__ import annotations

import os
import runpy
import sys

from builder.runtime.serve import api_key
from builder.runtime.serve.errors import UsageError

LAUNCHER_MODULE = "sglang.launch_server"


def main() -> None:
    try:
        key = api_key.take(os.environ)
    except UsageError as error:
        sys.exit(f"keyed_launch: error: {error}")
    if key is None:
        sys.exit(f"keyed_launch: error: no API key in {api_key.FILE_VARIABLE} or {api_key.KEY_VARIABLE}")
    sys.argv = [sys.argv[0], *sys.argv[1:], "--api-key", key]
    runpy.run_module(LAUNCHER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
