"""Every Triton kernel the plugin ships, compiled ahead of time on this machine (no GPU: triton's
bundled ptxas) for the GPUs it runs on, in every specialisation the plugin launches
(`triton_aot.py` records them from the real launchers over the producer tables and the model
profiles), so a kernel the installed triton cannot build fails here, not at the first SBO step of
a live server; and the triton table (`kernels/triton_versions.py`) says so exactly.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sglang_overlap.kernels.triton_versions import (
    KERNELS,
    Kernel,
    installed_triton,
    kernel_problem,
)
from tests.conftest import require_module
from tests.kernels import triton_aot

triton = require_module("triton", "triton is not installed (torch installs it on Linux)")
tl = require_module("triton.language", "triton is not installed")

SOURCE: dict[Kernel, str] = {
    "fused": "sglang_overlap.kernels.signal_fused.gemm_kernel",
    "sliced": "sglang_overlap.kernels.signal_sliced.store_signal_kernel",
    "silu_quant": "sglang_overlap.kernels.fp8.silu_mul_quant_kernel",
}
"""The kernel of each row of the triton table."""


@pytest.fixture(scope="module", autouse=True)
def fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A triton cache of this module's own: every compile here compiles (none is read back),
    with triton's own bundled ptxas (CI has no CUDA toolkit)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        mp.delenv("TRITON_PTXAS_PATH", raising=False)
        yield


@pytest.fixture(scope="module")
def launches() -> dict[str, list[triton_aot.Launch]]:
    from sglang_overlap.planning.producer_tables import shipped_gpus

    fused, stores = triton_aot.sbo_launches(list(shipped_gpus()))
    out: dict[str, list[triton_aot.Launch]] = {}
    for launch in [*fused, *stores, *triton_aot.silu_quant_launches()]:
        out.setdefault(launch.kernel, []).append(launch)
    return out


def _compile_all(specs: list[triton_aot.Specialisation]) -> tuple[list[str], float]:
    """(each failure as its specialisation and error, seconds); a compile that succeeds must
    hold a cubin for the target's arch."""
    failures, start = [], time.perf_counter()
    for spec in specs:
        try:
            kernel = triton_aot.compile_specialisation(spec)
        except Exception as exc:  # noqa: BLE001 - every failing specialisation is reported
            failures.append(f"{spec.describe()}: {type(exc).__name__}: {exc}")
            continue
        assert kernel.asm.get("cubin"), spec.describe()
        assert f".target {spec.target}" in kernel.asm["ptx"], spec.describe()
    return failures, time.perf_counter() - start


def test_every_shipped_kernel_is_launched_and_in_the_triton_table(
        launches: dict[str, list[triton_aot.Launch]]) -> None:
    shipped = triton_aot.shipped_kernels()
    assert shipped == set(launches), (
        f"triton.jit kernels in the package {sorted(shipped)} vs launches recorded "
        f"{sorted(launches)}: record the new kernel's launches in tests/kernels/triton_aot.py")
    assert set(SOURCE.values()) == shipped and set(SOURCE) == set(KERNELS), SOURCE


def test_the_launches_cover_every_producer_table_cell(
        launches: dict[str, list[triton_aot.Launch]]) -> None:
    """The recording reaches what the tables serve (a shrinking enumeration would compile
    nothing and pass): each shipped GPU's fused tiles (warps, stages), both signal forms, both
    tile orders, both activation-scale layouts; slices of one and of several experts."""
    from sglang_overlap.planning.producer_tables import load_producer_tables, shipped_gpus

    fused = triton_aot.unique(launches[SOURCE["fused"]])
    seen = {(dict(s.constexprs)[(s.fn.arg_names.index("BLOCK_M"),)], dict(s.options)["num_warps"],
             dict(s.options)["num_stages"]) for s in fused}
    for gpu in shipped_gpus():
        for tile in load_producer_tables(gpu).fused.cells[0]:
            assert (tile.block_m, tile.num_warps, tile.num_stages) in seen, (gpu, tile, seen)
    names = fused[0].fn.arg_names
    values = {name: {dict(s.constexprs).get((names.index(name),)) for s in fused}
              for name in ("SIGNAL", "M_INNER", "s_asm", "s_asg")}
    assert values["SIGNAL"] == {1, 2} and values["M_INNER"] == {False, True}, values
    assert 1 in values["s_asm"] and 1 in values["s_asg"], values  # MN-major and row-major
    stores = launches[SOURCE["sliced"]]
    widths = {launch.args[2] - launch.args[1] for launch in stores}  # hi - lo: units marked
    assert 1 in widths and max(widths) > 1, widths


@pytest.mark.parametrize("kernel", KERNELS)
def test_each_kernel_compiles_exactly_where_the_triton_table_says(
        kernel: Kernel, launches: dict[str, list[triton_aot.Launch]]) -> None:
    version = installed_triton()
    specs = triton_aot.unique(launches[SOURCE[kernel]])
    failures, seconds = _compile_all(specs)
    problem = kernel_problem(kernel, version)
    print(f"triton {version}: {kernel} {len(specs)} specialisations, {len(failures)} failed, "
          f"{seconds:.1f} s")
    if problem is None:
        assert not failures, (f"triton {version} fails {len(failures)} of {len(specs)} "
                              f"specialisations of {SOURCE[kernel]} (the first 3):\n"
                              + "\n".join(failures[:3]))
    else:
        assert failures, (f"kernels/triton_versions.py refuses {kernel} on triton {version} "
                          f"({problem}), but all {len(specs)} specialisations compile: update "
                          "the table")


# ------------------------------------------------------------------ the test of the test


def _dot_kernel() -> Any:
    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, KB: tl.constexpr,
                   N: tl.constexpr):
        a = tl.load(a_ptr + tl.arange(0, M)[:, None] * K + tl.arange(0, K)[None, :])
        b = tl.load(b_ptr + tl.arange(0, KB)[:, None] * N + tl.arange(0, N)[None, :])
        c = tl.dot(a, b)  # [M, K] x [KB, N]: K must equal KB
        tl.store(c_ptr + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :], c)

    return dot_kernel


@pytest.mark.parametrize("kb", [32, 64])
def test_a_planted_shape_mismatch_in_a_dot_fails_the_compile(kb: int) -> None:
    """The same recording and compile path, on a kernel whose tl.dot takes [64, 32] x [kb, 64]:
    the mismatched one is refused by triton, the matching twin compiles to a cubin."""
    import torch

    rec = triton_aot.Recorder(_dot_kernel())
    x = torch.empty((64, 64), dtype=torch.float16)
    rec[(1,)](x, x, torch.empty((64, 64), dtype=torch.float32), M=64, K=32, KB=kb, N=64)
    (spec,) = triton_aot.unique(rec.launches)
    if kb == 32:
        assert triton_aot.compile_specialisation(spec).asm["cubin"]
        return
    with pytest.raises(triton.compiler.CompilationError, match="(?i)dot|shape"):
        triton_aot.compile_specialisation(spec)


def test_the_specialisation_is_what_a_launch_binds() -> None:
    """Triton's own binder decides: a tensor's dtype is the pointer type, an aligned tensor gets
    the divisibility hint, a view 4 bytes into its allocation does not."""
    import torch

    rec = triton_aot.Recorder(_dot_kernel())
    x = torch.empty(4096, dtype=torch.float16)
    rec[(1,)](x[2:], x, torch.empty(4096, dtype=torch.float32), M=64, K=32, KB=32, N=64)
    (spec,) = triton_aot.unique(rec.launches)
    attrs = dict(spec.attrs)
    assert attrs[(0,)] == () and attrs[(1,)] == (("tt.divisibility", 16),), attrs
    assert dict(spec.signature)["a_ptr"] == "*fp16", spec.signature
    ttir = triton_aot.compile_specialisation(spec).asm["ttir"]  # the compile took the hints
    head = ttir[ttir.index("tt.func"):].split("\n")[0]  # the kernel's signature line
    hints = re.findall(r"!tt\.ptr<(\w+)>( \{tt\.divisibility = 16 : i32\})?", head)
    assert [(t, bool(h)) for t, h in hints] == [("f16", False), ("f16", True), ("f32", True)], head
