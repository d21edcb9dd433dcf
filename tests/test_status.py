"""`builder status`: the table, JSON and Markdown on the project's lock and from a fresh clone with the
network refused; a failing smoke check, a bench regression and a rejected candidate as the lock's own
records write them; bench figures over the lock's git history; the look-ups `builder bump --newer` and
`--refresh-newer` remember (against a loopback index); bad input in one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from builder.config import reference_figures
from builder.config.matrix import load_matrix
from builder.lock import records, store
from builder.status.history import WORKING_TREE, bench_history
from builder.status.model import looked_up_packages
from builder.status.page import step_label
from checkouts import REPO, clone_checkout, run_builder
from loopback_index import LoopbackServer, make_wheel
from status_projects import (DATES, EAGLE, FAILED_CHECK, ODD_CHECK, PASSING, REGRESSION, REJECTED_CHECK,
                             REJECTED_STACK, STACK, expected_state, regression_project, run_offline)


def _env(tmp_path: Path, **extra: str) -> dict:
    """The project's own lock and a private cache: no look-up is remembered unless the test makes one."""
    env = {k: v for k, v in os.environ.items() if k not in ("BUILDER_LOCK", "PIP_INDEX_URL")}
    return {**env, "BUILDER_CACHE": str(tmp_path / "cache"), **extra}


def _status_json(root: Path, env: dict, *args: str) -> dict:
    result = run_offline("status", "--matrix", str(root / "matrix.toml"), "--json", *args, cwd=root, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def regression(tmp_path):
    return regression_project(tmp_path / "project")


def test_the_table_has_one_line_per_row_with_what_the_lock_records(tmp_path):
    matrix = load_matrix(REPO / "matrix.toml")
    lock = store.read(REPO / "matrix.lock")
    result = run_builder("status", env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:6] == ["stack", "state", "image", "tag", "digest", "engine"]
    rows = matrix.all_rows()
    assert [line.split()[0] for line in lines[1:1 + len(rows)]] == [row.name for row in rows]
    for row, line in zip(rows, lines[1:]):
        entry = lock.get(row.name)
        assert line.split()[1] == expected_state(entry).split()[0]
        image = entry.outcome.image if entry else None
        if image:
            assert f"  {image.image_id.split(':')[1][:12]}  {image.immutable_tag}  " in line
            assert str(image.engine) in line
        for mode in row.serve.modes:
            assert f" {mode.name} " in line
    assert lines[-1].startswith("upstream: no look-up recorded here")


def test_json_gives_the_same_rows_and_their_references(tmp_path):
    matrix = load_matrix(REPO / "matrix.toml")
    lock = store.read(REPO / "matrix.lock")
    document = _status_json(REPO, _env(tmp_path))
    assert [row["stack"] for row in document["rows"]] == [row.name for row in matrix.all_rows()]
    figures = reference_figures.load(REPO / "bench" / "reference.toml")
    for row, found in zip(matrix.all_rows(), document["rows"]):
        entry = lock.get(row.name)
        assert found["state"] == expected_state(entry)
        assert found["image_id"] == (entry.outcome.image.image_id if entry and entry.outcome.image else None)
        assert [m["mode"] for m in found["modes"]] == [m.name for m in row.serve.modes]
        assert {m["tolerance"] for m in found["modes"]} == {row.bench.regression_tolerance}
    cu128 = next(r for r in document["rows"] if r["stack"] == "sglang-0.5.9-cu128")
    baseline = next(m for m in cu128["modes"] if m["mode"] == "baseline")
    assert baseline["reference_tok_s"] == reference_figures.pinned(figures, "sglang-0.5.9-cu128", "baseline")["tok_s"]
    assert baseline["verdict"] == "not measured"


def test_a_fresh_clone_shows_every_view_with_the_network_refused(tmp_path):
    clone = clone_checkout(tmp_path / "clone")
    env = _env(tmp_path)
    rows = [row.name for row in load_matrix(clone / "matrix.toml").all_rows()]
    table = run_offline("status", cwd=clone, env=env)
    assert table.returncode == 0, table.stderr
    assert [line.split()[0] for line in table.stdout.splitlines()[1:1 + len(rows)]] == rows
    assert [row["stack"] for row in _status_json(clone, env)["rows"]] == rows
    markdown = run_offline("status", "--markdown", cwd=clone, env=env)
    assert markdown.returncode == 0 and markdown.stdout.count("\n| ") == len(rows) + 2, markdown.stderr
    page = run_offline("status", "--html", str(tmp_path / "site"), cwd=clone, env=env)
    assert (page.returncode, page.stdout) == (0, f"wrote {tmp_path / 'site' / 'index.html'}\n"), page.stderr
    text = (tmp_path / "site" / "index.html").read_text()
    assert all(f'data-stack="{row}"' in text for row in rows)
    assert "<script" not in text and "http://" not in text and "https://" not in text


def test_the_refusal_of_the_network_is_real(tmp_path):
    """The harness the other tests trust: a look-up through it dies, and says what it tried."""
    result = run_offline("status", "--refresh-newer", cwd=REPO,
                         env=_env(tmp_path, PIP_INDEX_URL="http://127.0.0.1:9/simple/"))
    assert result.returncode == 97 and "network use refused: socket." in result.stderr


def test_a_failing_check_a_regression_and_a_rejected_candidate(regression, tmp_path):
    env = _env(tmp_path)
    rows = {row["stack"]: row for row in _status_json(regression, env)["rows"]}
    built = rows[STACK]
    assert built["state"] == "built"
    assert built["smoke"]["outcome"] == "failed" and built["smoke"]["failed_checks"] == [FAILED_CHECK, ODD_CHECK]
    modes = {m["mode"]: m for m in built["modes"]}
    assert (modes["baseline"]["tok_s"], modes["baseline"]["reference_tok_s"], modes["baseline"]["verdict"]) == (
        REGRESSION["tok_s"], 89.5, "regression")
    assert modes["baseline"]["change"] == pytest.approx(80.0 / 89.5 - 1)
    assert (modes["eagle3"]["tok_s"], modes["eagle3"]["verdict"]) == (EAGLE["tok_s"], "pass")
    assert modes["baseline-fusion"]["verdict"] == "not measured"
    assert {p["in_image"] for p in built["patches"]} == {"applied"}
    assert built["engine"] == "buildah 1.39.3" and built["base"] == "debian-bookworm@" + "b" * 12
    rejected = rows[REJECTED_STACK]
    assert rejected["state"] == "rejected" and rejected["rejected"]["failed_checks"] == [REJECTED_CHECK]
    table = run_offline("status", "--matrix", str(regression / "matrix.toml"), cwd=regression, env=env).stdout
    line = next(line for line in table.splitlines() if line.startswith(STACK + " "))
    assert "built" in line.split() and f"failed (4 passed, 2 failed, 1 skipped): {FAILED_CHECK}, {ODD_CHECK}" in line
    assert "baseline 80.0/89.5 -10.6% (±3%) regression" in line and "eagle3 55.0/54.1 +1.7% (±3%) pass" in line


def test_markdown_marks_the_regression_and_keeps_every_value_as_text(regression, tmp_path):
    result = run_offline("status", "--matrix", str(regression / "matrix.toml"), "--markdown", "--stack", STACK,
                         cwd=regression, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith(f"| {STACK} |")]
    cells = re.split(r"(?<!\\)\|", row)[1:-1]  # only unescaped pipes separate cells
    assert len(cells) == 11
    assert "**baseline 80.0/89.5 -10.6% (±3%) regression**" in cells[8]
    assert r"imports.&lt;b&gt;x&lt;/b&gt;\|y\*z" in cells[7] and "<b>" not in row
    assert cells[1].strip() == "**built**"


def test_bench_history_dates_each_figure_by_the_commit_that_recorded_it(regression, tmp_path):
    points = [p for p in bench_history(regression / "matrix.lock", regression) if p.stack == STACK]
    assert [(p.mode, p.tok_s, p.verdict, p.when) for p in points] == [
        ("baseline", PASSING["tok_s"], "pass", DATES[1]), ("eagle3", EAGLE["tok_s"], "pass", DATES[1]),
        ("baseline", REGRESSION["tok_s"], "regression", DATES[2])]
    records.record_bench(STACK, {"stack": STACK, "mode": "baseline", "tok_s": 90.0, "verdict": "pass",
                                 "gpus": ["NVIDIA RTX PRO 6000 Blackwell"] * 8, "model": "/models/test"},
                         path=regression / "matrix.lock")
    newest = bench_history(regression / "matrix.lock", regression)[-1]
    assert (newest.tok_s, newest.when, newest.commit) == (90.0, WORKING_TREE, None)
    outside = tmp_path / "elsewhere.lock"  # a lock outside the checkout: its current figures only
    outside.write_text((regression / "matrix.lock").read_text())
    assert [p.when for p in bench_history(outside, regression)] == [WORKING_TREE] * 2


def _newest_pins() -> tuple[str, str]:
    """(a release beyond every row's sglang, the family pinning the highest), from the matrix as it is."""
    pinned = max((row.package("sglang").parsed_version, row.family) for row in load_matrix(REPO / "matrix.toml").registry_stacks)
    return f"{pinned[0].major}.{pinned[0].minor}.{pinned[0].micro + 1}", pinned[1]


@pytest.fixture
def loopback_index(tmp_path):
    """pip's default index on 127.0.0.1: each package the rows take from it at a row's pin; sglang also one
    release beyond every row's, and a release candidate beyond that."""
    server = LoopbackServer(tmp_path / "served")
    newest, _ = _newest_pins()
    matrix = load_matrix(REPO / "matrix.toml")
    pins = {name: next(row.package(name).version for row in matrix.registry_stacks if row.package(name))
            for name in looked_up_packages(matrix)}
    wheels = [make_wheel(tmp_path / "served" / "files", name, version) for name, version in (
        *pins.items(), ("sglang", newest), ("sglang", "9.0.0rc1"))]
    url = server.publish("simple", wheels)
    yield url
    server.stop()


def test_bump_newer_remembers_and_status_shows_it_without_the_network(tmp_path, loopback_index):
    newest, family = _newest_pins()
    env = _env(tmp_path, PIP_INDEX_URL=loopback_index)
    result = run_builder("bump", "--newer", "sglang", env=env)
    assert (result.returncode, result.stdout) == (0, f"pin=sglang=={newest}\nfrom={family}\n"), result.stderr
    cache = json.loads((tmp_path / "cache" / "bump-newer.json").read_text())
    assert list(cache["packages"]) == ["sglang"] and cache["packages"]["sglang"]["newest"] == newest
    document = _status_json(REPO, _env(tmp_path))
    assert all([(n["package"], n["newest"]) for n in row["newer"]] == [("sglang", newest)] for row in document["rows"])
    assert all(row["newer_checked"] == cache["packages"]["sglang"]["checked"] for row in document["rows"])


def test_refresh_newer_asks_for_every_package_the_rows_take_from_the_index(tmp_path, loopback_index):
    matrix = load_matrix(REPO / "matrix.toml")
    result = run_builder("status", "--refresh-newer", "--json", env=_env(tmp_path, PIP_INDEX_URL=loopback_index))
    assert result.returncode == 0, result.stderr
    upstream = {item["package"]: item for item in json.loads(result.stdout)["upstream"]}
    taken = {p.name for row in matrix.registry_stacks for p in row.packages if not (p.index or p.url)}
    assert set(upstream) == taken == set(looked_up_packages(matrix)) and all(item["newest"] and item["checked"] for item in upstream.values())
    assert upstream["sglang"]["newest"] == _newest_pins()[0]  # the newest final release, not the candidate
    offline = run_offline("status", "--json", cwd=REPO, env=_env(tmp_path))  # the cache, no network
    assert json.loads(offline.stdout)["upstream"] == list(upstream.values())


def test_an_unreadable_cache_is_no_look_up(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "bump-newer.json").write_text('{"schema": 1, "packages": {"sglang": {"newest": "x!"}}}')
    document = _status_json(REPO, _env(tmp_path))
    assert all(row["newer_checked"] is None for row in document["rows"])


@pytest.mark.parametrize("args, words", [
    (("--stack", "sglang-9.9"), "unknown stack 'sglang-9.9'"),
    (("--json", "--markdown"), "not allowed with argument --json"),
    (("--html", "matrix.toml"), "matrix.toml: not a directory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    result = run_builder("status", *args, env=_env(tmp_path))
    assert (result.returncode, result.stdout) == (2, "")
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("builder: error: ") and words in lines[0], lines


def test_layer_steps_are_named_short():
    report = json.loads((REPO / "build-reports" / f"{STACK}.json").read_text())
    labels = [step_label(layer["step"]) for layer in report["layers"]]
    assert "install torch wheels" in labels and "compile site-packages" in labels and "COPY runtime/" in labels and "COPY stack.json" in labels
    assert "patch 0001-torch-symm-mem-sm120" in labels
    assert all(len(label) <= 40 for label in labels)
    assert subprocess.run(["git", "-C", str(REPO), "ls-files", "--error-unmatch", f"build-reports/{STACK}.json"],
                          capture_output=True).returncode == 0  # what a fresh clone has


def _workflow(name: str) -> dict:
    import yaml
    return yaml.safe_load((REPO / ".github" / "workflows" / name).read_text())


@pytest.mark.parametrize("name, job, after", [("build.yml", "build", "builder build --stack"),
                                              ("gpu.yml", "gpu", "builder pin")])
def test_build_and_gpu_write_the_rows_table_into_the_job_summary(name, job, after):
    steps = _workflow(name)["jobs"][job]["steps"]
    runs = [step.get("run", "") for step in steps]
    (summary,) = [i for i, run in enumerate(runs) if "builder status --markdown" in run]
    assert runs[summary].strip() == '.venv/bin/builder status --markdown --stack "$STACK" >> "$GITHUB_STEP_SUMMARY"'
    assert steps[summary]["if"] == "${{ !cancelled() }}"  # a failed build or a refused pin is shown too
    assert summary > next(i for i, run in enumerate(runs) if after in run)


def test_the_status_workflow_builds_the_page_from_main_and_deploys_it_with_pages():
    workflow = _workflow("status.yml")
    assert workflow[True]["push"] == {"branches": ["main"]} and workflow["permissions"] == {"contents": "read"}
    page, deploy = workflow["jobs"]["page"], workflow["jobs"]["deploy"]
    checkout = page["steps"][0]
    assert checkout["with"]["fetch-depth"] == 0 and checkout["with"]["persist-credentials"] is False
    runs = [step.get("run", "") for step in page["steps"]]
    assert "builder status --html site --refresh-newer" in runs
    (upload,) = [s for s in page["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact@")]
    assert upload["with"]["path"] == "site" and "permissions" not in page
    assert deploy["needs"] == "page" and deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]
    assert deploy["environment"]["url"] == "${{ steps.deployment.outputs.page_url }}"
