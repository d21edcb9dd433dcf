"""Test-only stand-in package shadowing sglang: only `sglang.launch_server` exists."""

__version__ = "0.5.9"
