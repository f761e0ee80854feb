"""The installed deep_gemm's headers: which release they are, and a private patched copy.

Reads files only (deep_gemm is never imported); the installed wheel is never modified.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglang_overlap.kernels.signal_deepgemm.patching import apply_patch
from sglang_overlap.kernels.signal_deepgemm.versions import (
    KERNEL_HEADER,
    RELEASES,
    DgSignalError,
    Producer,
    Release,
    producer_for,
)

# patches/<version>/<Release.patch>, shipped as package data
PATCH_DIR = Path(__file__).resolve().parent / "patches"
CACHE_ENV = "SGLANG_OVERLAP_CACHE"


@dataclass(frozen=True)
class Installed:
    """What `installed()` found: deep_gemm's version and kernel header hash (None: absent)."""

    version: str | None
    header_sha256: str | None
    root: Path | None  # the deep_gemm package directory


@dataclass(frozen=True)
class Source:
    """Installed deep_gemm headers the signal patch covers."""

    version: str
    include: Path  # deep_gemm/include of the installed package
    spec: Release


def installed(search_path: list[str] | None = None) -> Installed:
    """The deep_gemm that imports first on `search_path` (default sys.path), read from disk."""
    from sglang_overlap.kernels.package_source import package_dir, package_version

    root = package_dir("deep_gemm", search_path)
    if root is None:
        return Installed(None, None, None)
    version = package_version("deep_gemm", search_path) or "unknown"
    header = root / "include" / KERNEL_HEADER
    digest = hashlib.sha256(header.read_bytes()).hexdigest() if header.is_file() else None
    return Installed(version, digest, root)


def served_producer(search_path: list[str] | None = None) -> tuple[str | None, Producer, str]:
    """(installed deep_gemm version, producer `producer_for` serves with it, why)."""
    found = installed(search_path)
    return (found.version, *producer_for(found.version, found.header_sha256))


def locate(search_path: list[str] | None = None) -> Source:
    """The installed headers, if a row of `RELEASES` covers them exactly; DgSignalError naming
    the version (and what is covered) otherwise."""
    found = installed(search_path)
    producer, why = producer_for(found.version, found.header_sha256)
    if producer != "deepgemm" or found.root is None or found.version is None:
        raise DgSignalError(why)
    return Source(found.version, found.root / "include", RELEASES[found.version])


def patch_text(spec: Release) -> str:
    path = PATCH_DIR / spec.version / spec.patch
    if not path.is_file():
        raise DgSignalError(f"the signal patch {path} is missing from this install")
    return path.read_text()


def cache_root() -> Path:
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sglang-overlap")
    return Path(base) / "deepgemm-signal"


def prepared_include(source: Source) -> Path:
    """A private copy of `source.include` with the patch applied (built once, atomically)."""
    patch = patch_text(source.spec)
    key = hashlib.sha256((source.spec.header_sha256 + patch).encode()).hexdigest()[:16]
    target = cache_root() / f"{source.version}-{key}" / "include"
    if (target / KERNEL_HEADER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="include.", dir=target.parent))
    shutil.copytree(source.include, staging, dirs_exist_ok=True)
    header = staging / KERNEL_HEADER
    header.write_text(apply_patch(header.read_text(), patch))
    try:
        staging.rename(target)
    except OSError:  # another process won the race: theirs is the same
        shutil.rmtree(staging, ignore_errors=True)
    return target


def probe() -> str | None:
    """None when the patched producer can be built here, else one line saying why not (a CUDA
    device is not needed to answer)."""
    from sglang_overlap.kernels.signal_deepgemm.build import nvcc_path

    try:
        source = locate()
        patch_text(source.spec)
        nvcc_path()
    except DgSignalError as exc:
        return str(exc)
    return None
