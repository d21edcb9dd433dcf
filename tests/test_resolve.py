"""Resolution through real `uv pip compile` against package indexes served on loopback.

The wheels are made here (tiny, pure Python) so every path runs without the network: an extra
index (with best-match across indexes), a direct-URL wheel, an override of a declared pin, install
groups, and the sources that cannot be reached or answer 500. tests/test_resolve_network.py
resolves the real stack rows against the real index.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from builder.lock import resolve
from builder.lock.model import DEFAULT_INDEX
from builder.lock.resolution import check_current, lock_stacks, requirements
from builder.errors import UserError
from builder.config.matrix import load_matrix
from builder.config.stack import Override, Package
from loopback_index import LoopbackServer, make_wheel, sha256_of
from lock_values import base_digest_of, system_packages_of
from registries import free_port

REPO = Path(__file__).resolve().parent.parent
ROW = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """A default index and an extra index on loopback, plus a wheel published at a bare URL."""
    server = LoopbackServer(tmp_path_factory.mktemp("indexes"))
    files = server.root / "files"
    default = [
        make_wheel(files / "default", "demo-app", "1.0", ("demo-dep==1.0", "demo-lib>=1.0")),
        make_wheel(files / "default", "demo-dep", "1.0"),
        make_wheel(files / "default", "demo-dep", "1.1"),
        make_wheel(files / "default", "demo-lib", "1.0"),
        make_wheel(files / "default", "demo-kernel-extra", "3.0"),
    ]
    extra = [
        make_wheel(files / "extra", "demo-accel", "2.0+cu999", ("demo-accel-runtime==2.0", "demo-lib")),
        make_wheel(files / "extra", "demo-accel-runtime", "2.0"),
        # The extra index mirrors demo-lib at an old version only: first-index would take it.
        make_wheel(files / "extra", "demo-lib", "0.9"),
    ]
    direct = make_wheel(files / "direct", "demo-kernel", "1.0", ("demo-accel", "demo-kernel-extra"))
    yield {
        "base": server.url,
        "default": server.publish("default/simple", default),
        "extra": server.publish("extra/simple", extra),
        "direct_url": server.file_url(direct),
        "files": {w.name: w for w in [*default, *extra, direct]},
    }
    server.stop()


@pytest.fixture
def demo(indexes, monkeypatch):
    """Point uv's default index at the loopback one; give the demo names install groups."""
    monkeypatch.setenv("UV_DEFAULT_INDEX", indexes["default"])
    monkeypatch.setitem(resolve.PACKAGE_GROUPS, "demo-accel", "torch")
    monkeypatch.setitem(resolve.PACKAGE_GROUPS, "demo-kernel", "kernels")
    return indexes


def demo_stack(indexes: dict, *, extra_index: str | None = None, direct_url: str | None = None,
               overrides: bool = True):
    packages = (
        Package("demo-accel", "2.0+cu999", index=extra_index or indexes["extra"]),
        Package("demo-kernel", "1.0", url=direct_url or indexes["direct_url"]),
        Package("demo-dep", "1.1"),
        Package("demo-app", "1.0"),
    )
    declared = (Override("demo-dep", "demo-app", "==1.0", "the test pins 1.1 on purpose"),)
    return dataclasses.replace(ROW, name="demo-row", python="3.11", packages=packages,
                               overrides=declared if overrides else ())


def test_resolves_closure_with_hashes_sources_and_groups(demo):
    resolution = resolve.resolve(demo_stack(demo))
    found = {d.name: d for d in resolution.distributions}
    assert sorted(found) == ["demo-accel", "demo-accel-runtime", "demo-app", "demo-dep", "demo-kernel",
                             "demo-kernel-extra", "demo-lib"]
    assert [d.name for d in resolution.distributions] == sorted(found)
    # The override: demo-app declares demo-dep==1.0, the stack's 1.1 wins.
    assert found["demo-dep"].version == "1.1"
    # best-match across indexes: demo-lib 1.0 from the default index, not the extra index's 0.9.
    assert found["demo-lib"].version == "1.0"
    assert resolution.index_strategy == "unsafe-best-match"
    assert resolution.indexes == (demo["extra"],)
    for dist in found.values():
        wheel = demo["files"][dist.wheel]
        assert dist.sha256 == sha256_of(wheel)
        assert dist.hashes == (dist.sha256,)
    assert found["demo-accel"].source == demo["extra"]
    assert found["demo-accel-runtime"].source == demo["extra"]
    assert found["demo-kernel"].source == demo["direct_url"] == found["demo-kernel"].url
    assert found["demo-app"].source == found["demo-lib"].source == DEFAULT_INDEX
    groups = {name: dist.group for name, dist in found.items()}
    assert groups == {
        "demo-accel": "torch", "demo-accel-runtime": "torch", "demo-lib": "torch",
        "demo-kernel": "kernels", "demo-kernel-extra": "kernels",
        "demo-app": "sglang", "demo-dep": "sglang",
    }


def test_requirements_texts_pin_each_group_to_the_locked_files(demo, tmp_path):
    stack = demo_stack(demo)
    path = tmp_path / "matrix.lock"
    lock_stacks([stack], path=path, base_resolver=base_digest_of, apt_resolver=system_packages_of)
    texts = requirements(check_current(stack, path).resolution)
    accel, kernel = demo["files"]["demo_accel-2.0+cu999-py3-none-any.whl"], demo["files"]["demo_kernel-1.0-py3-none-any.whl"]
    # The sources (extra index, direct URL) are the wheel cache's to use; pip installs with no index.
    assert f"demo-accel==2.0+cu999 \\\n    --hash=sha256:{sha256_of(accel)}\n" in texts["torch"]
    assert f"demo-kernel==1.0 \\\n    --hash=sha256:{sha256_of(kernel)}\n" in texts["kernels"]
    assert not any(marker in text for text in texts.values() for marker in ("--extra-index-url", "://"))
    assert "demo-dep==1.1 \\\n" in texts["sglang"]


def test_without_the_override_the_declared_pin_conflicts(demo):
    with pytest.raises(UserError) as failure:
        resolve.resolve(demo_stack(demo, overrides=False))
    message = str(failure.value)
    assert message.startswith("demo-row: uv found no resolution: ")
    assert "demo-dep" in message and "\n" not in message


def test_unreachable_extra_index_is_one_line_and_writes_nothing(demo, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/simple"
    path = tmp_path / "matrix.lock"
    lock_stacks([demo_stack(demo)], path=path, base_resolver=base_digest_of, apt_resolver=system_packages_of)
    before = path.read_bytes()
    with pytest.raises(UserError) as failure:
        lock_stacks([demo_stack(demo), demo_stack(demo, extra_index=dead)], path=path,
                         base_resolver=base_digest_of, apt_resolver=system_packages_of)
    assert str(failure.value) == (
        f"demo-row: cannot reach package index {dead} (connection refused); nothing was locked")
    assert path.read_bytes() == before


def test_index_answering_500_is_named(demo):
    broken = f"{demo['base']}/broken/simple"
    with pytest.raises(UserError, match=rf"^demo-row: package index {broken} answered HTTP 500; nothing was locked$"):
        resolve.resolve(demo_stack(demo, extra_index=broken))


def test_unreachable_wheel_url_is_named(demo):
    dead = f"http://127.0.0.1:{free_port()}/demo_kernel-1.0-py3-none-any.whl"
    with pytest.raises(UserError, match=r"^demo-row: cannot reach wheel URL .*demo_kernel-1\.0.*connection refused"):
        resolve.resolve(demo_stack(demo, direct_url=dead))


def test_missing_uv_is_a_user_error(demo):
    with pytest.raises(UserError, match="^no-such-uv not found: install uv"):
        resolve.resolve(demo_stack(demo), uv="no-such-uv")


def test_override_of_an_unpinned_package_is_refused(demo):
    stack = dataclasses.replace(demo_stack(demo), overrides=(Override("demo-ghost", "demo-app", "==1", "x"),))
    with pytest.raises(UserError, match="^demo-row: override for demo-ghost, which the stack does not pin$"):
        resolve.resolve(stack)


def test_groups_follow_the_dependency_graph():
    parents = {
        "torch": ("sglang", "flashinfer-python"),
        "filelock": ("torch",),
        "nvidia-nccl-cu12": ("torch",),
        "flashinfer-python": ("sglang",),
        "numpy": ("flashinfer-python", "sglang"),
        "sgl-kernel": ("sglang",),
        "sglang": (),
        "requests": ("sglang",),
        "urllib3": ("requests",),
    }
    assert resolve.assign_groups(parents) == {
        "torch": "torch", "filelock": "torch", "nvidia-nccl-cu12": "torch",
        "flashinfer-python": "kernels", "numpy": "kernels", "sgl-kernel": "kernels",
        "sglang": "sglang", "requests": "sglang", "urllib3": "sglang",
    }


def test_wheel_choice_follows_tag_preference():
    ranking = {tag: rank for rank, tag in enumerate(resolve.target_tags("3.12"))}
    files = [
        ("https://h/x/demo-1.0-py3-none-any.whl", "a" * 64),
        ("https://h/x/demo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "b" * 64),
        ("https://h/x/demo-1.0-cp312-cp312-manylinux_2_34_x86_64.whl", "c" * 64),  # too new a glibc
        ("https://h/x/demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", "d" * 64),  # other python
        ("https://h/x/demo-1.0.tar.gz", "e" * 64),
    ]
    assert resolve.fitting_wheels(files, ranking) == [
        ("demo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "b" * 64),
        ("demo-1.0-py3-none-any.whl", "a" * 64),
    ]


def test_parse_annotated_reads_via_and_from():
    text = (
        "demo-app==1.0\n    # via -r requirements.in\n    # from https://idx/simple\n"
        "demo-dep==1.1\n    # via\n    #   --override overrides.txt\n    #   -r requirements.in\n"
        "    #   demo-app\n    # from https://idx/simple\n"
        "demo-kernel @ https://h/demo_kernel-1.0-py3-none-any.whl\n    # via -r requirements.in\n"
    )
    entries = resolve.parse_annotated(text)
    assert entries["demo-dep"].parents == ("demo-app",)
    assert entries["demo-dep"].version == "1.1" and entries["demo-dep"].index == "https://idx/simple"
    assert entries["demo-app"].parents == ()
    assert entries["demo-kernel"].url == "https://h/demo_kernel-1.0-py3-none-any.whl"
    assert entries["demo-kernel"].version is None


def _graph_pass_sees_an_older_page(monkeypatch, page: Path, times: int) -> list[list[str]]:
    """The index's page for one project loses its files during uv's graph pass, `times` times, as a
    mirror edge answering with an older copy does; returns every uv command line run."""
    real_run, calls, served = resolve._run_uv, [], page.read_text()

    def run(stack, argv):
        calls.append(argv)
        graph_pass = "-c" in argv
        if graph_pass and sum("-c" in c for c in calls) <= times:
            page.write_text("<!DOCTYPE html><html><body>\n</body></html>\n")
        try:
            return real_run(stack, argv)
        finally:
            page.write_text(served)

    monkeypatch.setattr(resolve, "_run_uv", run)
    return calls


def test_a_page_that_changes_between_the_two_passes_is_read_again(demo, monkeypatch, tmp_path):
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    page = Path(demo["files"]["demo_lib-1.0-py3-none-any.whl"]).parents[2] / "default/simple/demo-lib/index.html"
    calls = _graph_pass_sees_an_older_page(monkeypatch, page, times=1)
    found = {d.name: d.version for d in resolve.resolve(demo_stack(demo)).distributions}
    assert found["demo-lib"] == "1.0"
    assert len(calls) == 4  # pins, graph (older page), pins, graph


def test_a_page_that_keeps_changing_is_one_line_naming_the_index(demo, monkeypatch, tmp_path):
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    page = Path(demo["files"]["demo_lib-1.0-py3-none-any.whl"]).parents[2] / "default/simple/demo-lib/index.html"
    _graph_pass_sees_an_older_page(monkeypatch, page, times=2)
    with pytest.raises(UserError) as caught:
        resolve.resolve(demo_stack(demo))
    message = str(caught.value)
    assert "\n" not in message
    assert "demo-lib" in message and "changed between two reads, 2 times" in message
