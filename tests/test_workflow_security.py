"""Every workflow in .github/workflows/, read as YAML: actions pinned by commit, workflow_run jobs only for
pushes to this repository, and write tokens kept away from the jobs that run upstream code.

The rules hold for any file in the folder, so a workflow added later is checked the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted(p for p in (REPO / ".github" / "workflows").iterdir() if p.suffix in (".yml", ".yaml"))
NAMES = [p.name for p in WORKFLOWS]

# owner/repo[/path]@<40 hex> # v1.2.3: the commit is what runs, the comment says which release it is.
PINNED = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(/[^@\s]+)?@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"#\s*v\d+(\.\d+){0,2}\s*$")
# Commands that build or run code the repository does not hold yet (a candidate's wheels, an image of
# them), where a shell line runs a command: not inside a commit message.
RUNS_UPSTREAM = re.compile(
    r"(?:^|[;&|(]|\bdo\b|\bthen\b)\s*(?:sudo\s+(?:-\S+\s+)*)?(?:\S*/)?"
    r"(builder\s+(?:bump|build|smoke|base|bench)|docker\s+run|podman\s+run)\b",
    re.MULTILINE,
)
PUSH_OF_THIS_REPOSITORY = (
    "github.event.workflow_run.event == 'push'",
    "github.event.workflow_run.head_repository.full_name == github.repository",
)
DISPATCH = "github.event_name == 'workflow_dispatch' ||"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def triggers(workflow: dict) -> dict:
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as true
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return on


def uses_of(workflow: dict) -> list[str]:
    found = []
    for job in workflow["jobs"].values():
        if "uses" in job:  # a reusable workflow
            found.append(job["uses"])
        found += [step["uses"] for step in job.get("steps", []) if "uses" in step]
    return found


def writes(permissions) -> bool:
    if isinstance(permissions, str):
        return permissions == "write-all"
    return any(value == "write" for value in (permissions or {}).values())


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job.get("steps", []))


def needs_of(job: dict) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else list(needs)


def test_there_are_workflows():
    assert {"build.yml", "gpu.yml", "bump.yml"} <= set(NAMES)


@pytest.mark.parametrize("path", WORKFLOWS, ids=NAMES)
def test_every_action_is_pinned_by_commit_with_its_version_in_a_comment(path: Path):
    workflow = load(path)
    for reference in uses_of(workflow):
        if reference.startswith("./"):
            continue  # this repository's own action, at this commit
        if reference.startswith("docker://"):
            assert re.search(r"@sha256:[0-9a-f]{64}$", reference), f"{path.name}: {reference} not pinned by digest"
            continue
        assert PINNED.match(reference), f"{path.name}: {reference} is not pinned by a full commit sha"
    # YAML drops comments: the version comment is read from each `uses:` line of the text.
    lines = [line for line in path.read_text().splitlines() if re.match(r"^\s*(-\s+)?uses:\s", line)]
    assert len(lines) == len(uses_of(workflow))
    for line in lines:
        if "@" in line and not line.split("uses:", 1)[1].strip().startswith(("./", "docker://")):
            assert VERSION_COMMENT.search(line), f"{path.name}: {line.strip()} names no version in a comment"


@pytest.mark.parametrize("path", WORKFLOWS, ids=NAMES)
def test_workflow_run_jobs_run_only_for_a_push_of_this_repository(path: Path):
    workflow = load(path)
    on = triggers(workflow)
    assert "pull_request_target" not in on, f"{path.name}: pull_request_target runs a fork's code with secrets"
    if "workflow_run" not in on:
        return
    jobs = workflow["jobs"]

    def gated(name: str) -> bool:
        job = jobs[name]
        condition = str(job.get("if", ""))
        if all(part in condition for part in PUSH_OF_THIS_REPOSITORY):
            # Only a manual dispatch may stand beside the conjunction: no other alternative.
            rest = condition.replace(DISPATCH, "", 1) if condition.lstrip().startswith(DISPATCH) else condition
            return "||" not in rest
        # A job whose needed job was skipped is skipped too, unless its condition asks to run anyway.
        if re.search(r"\b(always|failure|cancelled)\(\)", condition):
            return False
        return any(gated(needed) for needed in needs_of(job))

    for name in jobs:
        assert gated(name), f"{path.name}: job {name} can run for a fork's or a pull request's build"


@pytest.mark.parametrize("path", WORKFLOWS, ids=NAMES)
def test_write_tokens_never_meet_upstream_code(path: Path):
    workflow = load(path)
    assert "permissions" in workflow, f"{path.name}: no workflow-wide permissions (the default may be write)"
    assert not writes(workflow["permissions"]), f"{path.name}: write permission for every job"
    jobs = workflow["jobs"]
    for name, job in jobs.items():
        text = runs(job)
        upstream = RUNS_UPSTREAM.findall(text)
        if writes(job.get("permissions")):
            assert not upstream, f"{path.name}: job {name} has write permission and runs {upstream}"
        if "builder bump" in upstream:
            checkouts = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
            assert checkouts and all(s.get("with", {}).get("persist-credentials") is False for s in checkouts), (
                f"{path.name}: job {name} runs upstream code with the checkout's token on disk"
            )
    # The job that proposes what an upstream-running job made reads it only from that job's artifact.
    for name, job in jobs.items():
        makers = [needed for needed in needs_of(job) if "builder bump" in RUNS_UPSTREAM.findall(runs(jobs[needed]))]
        if not (makers and writes(job.get("permissions"))):
            continue
        uploaded = {
            step["with"]["name"]
            for maker in makers
            for step in jobs[maker]["steps"]
            if step.get("uses", "").startswith("actions/upload-artifact@")
        }
        downloaded = {
            step["with"]["name"] for step in job["steps"] if step.get("uses", "").startswith("actions/download-artifact@")
        }
        assert downloaded and downloaded <= uploaded, f"{path.name}: job {name} does not take the artifact"


# The rules themselves: each finding of the review, as the workflows stood, fails them.
FINDINGS = {
    "tag-pinned": "on: push\npermissions: {contents: read}\njobs:\n  a:\n    runs-on: x\n"
                  "    steps:\n      - uses: actions/checkout@v5\n",
    "branch-only workflow_run": "on:\n  workflow_run: {workflows: [build], types: [completed], branches: [main]}\n"
                                "permissions: {contents: read}\njobs:\n  a:\n"
                                "    if: github.event.workflow_run.conclusion == 'success'\n    runs-on: x\n"
                                "    steps: [{run: scripts/python-env}]\n  b: {needs: a, runs-on: x, steps: [{run: x}]}\n",
    "write job builds": "on: push\npermissions: {contents: read}\njobs:\n  a:\n    runs-on: x\n"
                        "    permissions: {contents: write, pull-requests: write}\n"
                        "    steps: [{run: builder bump x}, {run: gh pr create}]\n",
}


@pytest.mark.parametrize("finding", FINDINGS)
def test_the_reviewed_findings_fail_these_rules(tmp_path: Path, finding: str):
    path = tmp_path / "finding.yml"
    path.write_text(FINDINGS[finding])
    rules = (test_every_action_is_pinned_by_commit_with_its_version_in_a_comment,
             test_workflow_run_jobs_run_only_for_a_push_of_this_repository, test_write_tokens_never_meet_upstream_code)
    failed = []
    for rule in rules:
        try:
            rule(path)
        except AssertionError:
            failed.append(rule.__name__)
    assert len(failed) == 1, failed
