"""A plain `pip install .` (a wheel, not an editable install) works on any checkout: the project is found
from the matrix, and the package ships its own data (the compatibility rules)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checkouts import clone_checkout

pytestmark = pytest.mark.network

UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The builder's wheel installed into a new virtual environment; returns its `builder` script."""
    work = tmp_path_factory.mktemp("install")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(work / "dist"),
                    str(clone_checkout(work / "source"))], check=True)
    [wheel] = (work / "dist").glob("sglang_image_builder-*.whl")
    subprocess.run([UV, "venv", "--quiet", "--python", sys.executable, str(work / "venv")], check=True)
    subprocess.run([UV, "pip", "install", "--quiet", "--python", str(work / "venv/bin/python"), str(wheel)],
                   check=True)
    return work / "venv" / "bin" / "builder"


def run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "BUILDER_LOCK")}
    return subprocess.run([str(script), *args], cwd=cwd, capture_output=True, text=True, env=environment)


def test_the_installed_package_lives_outside_any_checkout(installed):
    python = installed.with_name("python")
    where = subprocess.run([str(python), "-c", "import builder, builder.config.compat as c; "
                            "print(builder.__file__); print(bool(c.compat_data()))"],
                           capture_output=True, text=True, cwd="/", check=True).stdout.split()
    assert where[0].startswith(str(installed.parent.parent)) and where[1] == "True"


def test_render_check_and_patches_check_work_on_a_checkout(installed, tmp_path):
    checkout = clone_checkout(tmp_path / "checkout")
    rendered = run(installed, "render", "--check", cwd=checkout)
    assert rendered.returncode == 0, rendered.stderr
    # From elsewhere, naming the checkout's matrix: the project follows the matrix, not the working directory.
    checked = run(installed, "patches", "check", "--matrix", str(checkout / "matrix.toml"), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    assert "applied 0001-torch-symm-mem-sm120.patch" in checked.stdout
    assert run(installed, "lock", "--check", cwd=checkout).returncode == 0
