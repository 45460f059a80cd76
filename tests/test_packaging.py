"""What a user installs: the wheel and the sdist built from the checkout hold every file of
the package (sub-packages are found, not listed), and both pass twine's check.
.ci/check_wheel installs the wheels into a fresh venv and runs exoframe from another folder."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# what the package is made of (package-data too: the records' schemas are .json)
SHIPPED = (".py", ".yaml", ".typed", ".c", ".json")


def package_files() -> set[str]:
    """The package's files in the source tree, as paths from the repository root."""
    return {path.relative_to(REPO).as_posix() for path in (REPO / "exoframe").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in SHIPPED}


def test_the_wheel_and_sdist_hold_every_file_of_the_package(tmp_path):
    tree = tmp_path / "tree"  # a copy, so that the build leaves nothing in the checkout
    shutil.copytree(REPO / "exoframe", tree / "exoframe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist),
                    str(tree)], check=True, capture_output=True, text=True)
    (wheel,), (sdist,) = dist.glob("*.whl"), dist.glob("*.tar.gz")
    in_wheel = {name for name in zipfile.ZipFile(wheel).namelist()
                if name.startswith("exoframe/")}
    assert in_wheel == package_files(), (sorted(package_files() - in_wheel),
                                         sorted(in_wheel - package_files()))
    root = sdist.name.removesuffix(".tar.gz") + "/"
    with tarfile.open(sdist) as archive:
        in_sdist = {name.removeprefix(root) for name in archive.getnames()
                    if name.startswith(root + "exoframe/") and Path(name).suffix in SHIPPED}
    assert in_sdist == package_files()
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                              str(wheel), str(sdist)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_version_is_declared_once():
    import importlib.metadata

    tomllib = pytest.importorskip("tomllib")  # (Python 3.11 on)

    import exoframe

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert exoframe.__version__ == importlib.metadata.version("exoframe") == declared
