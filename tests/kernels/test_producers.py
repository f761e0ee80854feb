"""kernels/producers.py: the one line `check` and the start-up log print about which SBO
down-GEMM producer serves, for each verdict on the patched DeepGEMM kernel and triton."""

from __future__ import annotations

import pytest

from sglang_overlap.kernels import triton_versions
from sglang_overlap.kernels.producers import sbo_producers
from sglang_overlap.kernels.triton_versions import TritonCheck

NO_NVCC = "nvcc not found"
ODD = "capacities that are not a multiple of 64"


@pytest.mark.parametrize(("patched", "triton", "want"), [
    (None, "3.8.0", f"the patched DeepGEMM kernel; the fused Triton kernel at {ODD}"),
    (NO_NVCC, "3.8.0", "the fused Triton kernel or DeepGEMM slices, by shape (producer table); "
     f"the patched DeepGEMM kernel cannot: {NO_NVCC}"),
    (None, None, "none: the sliced SBO producer's signal store"),
    (NO_NVCC, "3.3.1", "none: the sliced SBO producer's signal store"),
    (None, "3.3.1", "none: the sliced SBO producer's signal store"),
])
def test_serves(patched: str | None, triton: str | None, want: str) -> None:
    got = sbo_producers(patched, triton_installed=triton is not None, triton_version=triton)
    assert got.serves.startswith(want), got
    assert got.patched_deepgemm == patched
    assert (got.fused is None) == (got.sliced is None) == (triton == "3.8.0"), got
    if triton == "3.3.1":
        assert "triton 3.3.1" in got.serves and "pip install triton==" in got.serves


def test_without_the_fused_kernel_slices_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = (TritonCheck("4.0.0", frozenset({"sliced", "silu_quant"}), "a lowering error"),)
    monkeypatch.setattr(triton_versions, "CHECKED", rows)
    got = sbo_producers(NO_NVCC, triton_installed=True, triton_version="4.0.0")
    assert got.serves.startswith(f"DeepGEMM slices (none at {ODD}), not the fused Triton kernel")
    assert "a lowering error" in got.serves and NO_NVCC in got.serves
    got = sbo_producers(None, triton_installed=True, triton_version="4.0.0")
    assert got.serves.startswith(f"the patched DeepGEMM kernel; none at {ODD} (")
    assert got.to_dict()["fused_triton"] == got.fused is not None


def test_an_unreadable_version_is_taken_to_build() -> None:
    got = sbo_producers(NO_NVCC, triton_installed=True, triton_version=None)
    assert got.fused is None and got.sliced is None and got.serves.startswith("the fused")
