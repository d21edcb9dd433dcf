"""Stand-ins for what cannot run here: an 8-GPU SGLang server and the GPUs' nvidia-smi.

Put this folder first on PYTHONPATH and bin/ first on PATH, and the entrypoint's
unchanged production command `python -m sglang.launch_server ...` starts the
stand-in; see harness.py.
"""
