#!/usr/bin/env bash
# Run the in-image smoke program directly on a GPU machine without Docker (an
# H200, compute capability 9.0), with that machine's python3 and torch. From the
# repository root:
#
#     bash tests/gpu/run_on_h200.sh            # or PYTHON=/path/to/python3 ...
#
# It writes a stack.json describing what this machine has (target 9.0, the
# installed distributions, torch's CUDA, the CUDA 13.0.1 stack's minimum driver
# from builder/config/compat_data.toml), runs every check and prints the table; checks
# that cannot run here (no sgl_kernel, no sglang, ...) say so as skips. With 2 or
# more GPUs that includes FlashInfer's fused all-reduce + residual + RMSNorm and
# torch's symmetric-memory all-reduce against NCCL. Then it plants a wrong
# expectation (--gpu-expect-offset 1): every GPU computation must fail; and a
# minimum driver newer than this machine's: the GPU checks must refuse (exit 3).
# Exit 0 only when all three come out so.
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" - "$work/stack.json" "$repo/builder/config/compat_data.toml" <<'PY'
import importlib.metadata as metadata, json, sys, tomllib
import torch

names = ("torch", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache",
         "sglang", "nvidia-nccl-cu12", "nvidia-cuda-runtime-cu12")
pins = {}
for name in names:
    try:
        pins[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
modes = {"baseline": {"args": {"tp_size": max(torch.cuda.device_count(), 1)}, "env": {}, "reasons": {},
                      "requires_draft_model": False, "reference": {"own": None, "replaced": None}}}
with open(sys.argv[2], "rb") as handle:
    minimum = tomllib.load(handle)["cuda_driver"]["13.0.1"]
info = {"schema": 2, "stack": "h200-direct", "cuda": torch.version.cuda or "none", "replaces": None,
        "driver": {"cuda": "13.0.1", "minimum": minimum["linux"], "source": minimum["source"]},
        "python": "%d.%d" % sys.version_info[:2], "target_arch": ["9.0"], "venv": sys.prefix,
        "distributions": pins, "patches": [],
        "serve": {"env": {}, "cache_dir": "/cache", "modes": modes},
        "bench": {"input_len": 128, "output_len": 32, "num_prompts": 4,
                  "regression_tolerance": 0.05},
        "overrides": []}
with open(sys.argv[1], "w") as handle:
    json.dump(info, handle, indent=2, sort_keys=True)
print("stack.json for this machine:", json.dumps(pins, sort_keys=True))
PY

echo "== smoke checks, real expectations =="
PYTHONPATH="$repo" "$python" -m builder.runtime.smoke --stack "$work/stack.json"
real=$?

echo "== the gpu rows' full details, real expectations =="
PYTHONPATH="$repo" "$python" -m builder.runtime.smoke --stack "$work/stack.json" --only gpu --json > "$work/real.json"
"$python" - "$work/real.json" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["results"]:
    print(f"{row['check']}: {row['status'].upper()}: {row['detail']}")
PY

echo "== gpu checks with a planted wrong expectation (offset 1): must fail =="
PYTHONPATH="$repo" "$python" -m builder.runtime.smoke --stack "$work/stack.json" --only gpu \
    --gpu-expect-offset 1 --json > "$work/planted.json"
"$python" - "$work/planted.json" <<'PY'
import json, sys
rows = {row["check"]: row for row in json.load(open(sys.argv[1]))["results"]}
for name, row in sorted(rows.items()):
    print(f"{name:24} {row['status'].upper():5} {row['detail']}")
ran = [row for name, row in rows.items()
       if name not in ("gpu.capability", "gpu.driver") and row["status"] != "skip"]
caught = ran and all(row["status"] == "fail" for row in ran)
print("planted expectation caught by every GPU computation that ran:", bool(caught))
sys.exit(0 if caught else 1)
PY
planted=$?

echo "== gpu checks with a planted minimum driver (999.0) newer than this machine's: must refuse, exit 3 =="
"$python" - "$work/stack.json" "$work/newer-driver.json" <<'PY'
import json, sys
info = json.load(open(sys.argv[1]))
info["driver"]["minimum"] = "999.0"
json.dump(info, open(sys.argv[2], "w"))
PY
PYTHONPATH="$repo" "$python" -m builder.runtime.smoke --stack "$work/newer-driver.json" --only gpu
refused=$?

echo "real run exit status $real (0: no failure); planted run caught: $([ $planted = 0 ] && echo yes || echo no); newer driver minimum: exit $refused (3: refused)"
[ "$real" = 0 ] && [ "$planted" = 0 ] && [ "$refused" = 3 ]
