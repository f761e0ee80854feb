"""pyproject.toml's packaging: the wheel pip builds from the sdist ships every file the code reads
from the package (the DeepGEMM signal patches, `kernels/signal_deepgemm/headers.py`'s
PATCH_DIR), as regular files with the source tree's bytes; the package holds no symlink."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from sglang_overlap.kernels.signal_deepgemm import headers
from sglang_overlap.kernels.signal_deepgemm.versions import RELEASES
from tests.conftest import require_module

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "sglang_overlap"
# what the sdist is built from: the package and the files pyproject.toml names
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE")


def _patches() -> dict[str, bytes]:
    """Archive name -> bytes of every file under PATCH_DIR in the source tree."""
    assert headers.PATCH_DIR.is_relative_to(PACKAGE), headers.PATCH_DIR
    return {path.relative_to(REPO).as_posix(): path.read_bytes()
            for path in sorted(headers.PATCH_DIR.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel) built by `python -m build` as `.ci/run` does, from a copy of the project
    (symlinks kept as links), the wheel from the sdist as pip builds it."""
    require_module("build", "the test extra's `build` is not installed")
    root = tmp_path_factory.mktemp("packaging")
    src = root / "src"
    shutil.copytree(PACKAGE, src / PACKAGE.name, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in PROJECT_FILES:
        shutil.copy2(REPO / name, src / name)
    out = root / "dist"
    # no isolation: setuptools from this environment, nothing downloaded
    run = subprocess.run([sys.executable, "-m", "build", "--no-isolation",
                          "--skip-dependency-check", "--outdir", str(out), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"python -m build failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
    (sdist,), (wheel,) = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    return sdist, wheel


def test_every_release_reads_a_patch_under_patch_dir() -> None:
    patches = _patches()
    for version, release in RELEASES.items():
        name = (headers.PATCH_DIR / version / release.patch).relative_to(REPO).as_posix()
        assert name in patches, f"{version=} {name=} not in {sorted(patches)}"


def test_the_package_holds_no_symlink() -> None:
    links = [os.path.join(top, name) for top, dirs, files in os.walk(PACKAGE)
             for name in dirs + files if os.path.islink(os.path.join(top, name))]
    assert not links, f"symlinks under sglang_overlap/ (the wheel must not depend on them): {links}"


def test_the_wheel_ships_the_patches_as_regular_files(dist: tuple[Path, Path]) -> None:
    _, wheel = dist
    patches = _patches()
    with zipfile.ZipFile(wheel) as zf:
        infos = {info.filename: info for info in zf.infolist()}
        shipped = {name for name in infos if name.startswith(f"{PACKAGE.name}/")
                   and name.endswith(".patch")}
        assert shipped == {n for n in patches if n.endswith(".patch")}, (
            f"{wheel.name}: missing {sorted(set(patches) - shipped)}, "
            f"extra {sorted(shipped - set(patches))}")
        for name, data in patches.items():
            info = infos.get(name)
            assert info is not None, f"{wheel.name} lacks {name}"
            mode = info.external_attr >> 16
            assert not stat.S_ISLNK(mode) and not info.is_dir(), f"{name=} {mode=:o}"
            assert zf.read(name) == data, f"{name} in {wheel.name} differs from the source tree"


def test_the_sdist_ships_the_patches_as_regular_files(dist: tuple[Path, Path]) -> None:
    sdist, _ = dist
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1]: m for m in tf.getmembers() if "/" in m.name}
        for name, data in _patches().items():
            member = members.get(name)
            assert member is not None and member.isfile(), f"{sdist.name}: {name=} {member=}"
            extracted = tf.extractfile(member)
            assert extracted is not None and extracted.read() == data, f"{name} differs"
