"""The CPU serving kit: what a CPU-only machine needs to run real SGLang 0.5.23 servers in the
end-to-end tests (see build.py). Test-only: not part of the sglang_overlap wheel."""

from tests.kit.build import (
    INSTALL_HINT,
    Kit,
    KitMissing,
    build_kit,
    build_tiny_dsv3,
    cache_root,
    find_executable,
    pd_missing,
)

__all__ = ["INSTALL_HINT", "Kit", "KitMissing", "build_kit", "build_tiny_dsv3", "cache_root",
           "find_executable", "pd_missing"]
