"""SignalPlan.path "fused": the plugin's Triton fp8 masked GEMM that raises SBO signals per tile.

An fp8 grouped masked GEMM with DeepGEMM's block-scale recipe (1x128 activation, 128x128
weight scales) that, after storing each output tile, bumps the tile's counter with a gpu-scope
*release* atomic. Per-block form: one int32 counter per (expert, block_m) row block, final at
`n_tiles`. Per-expert form (what sgl-deep-ep 0.1.2.post1's `low_latency_combine(overlap=True,
src_signals=..., src_signal_expect_value=...)` reads): one uint32 counter per expert, final at
`blocks_per_expert * n_tiles`; tiles past masked_m bump too, so an expert with zero tokens still
reaches its value and nothing waits forever.

Both forms and values come from `planning.sbo_layout.SboLayout`. Triton is imported lazily.

Legend: E local experts, M capacity rows per expert, K reduction dim, N output dim (hidden).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sglang_overlap.planning.sbo_layout import SboLayout

BLOCK_K = 128  # = the scale group: one activation and one weight scale per K step


@dataclass(frozen=True)
class SignalGemmConfig:
    """Tile shape and launch shape of the fused kernel."""

    block_m: int = 64
    """Rows of one tile; also the per-block signal's row block."""
    block_n: int = 128
    """Columns of one tile (divides 128 or is a multiple of it)."""
    num_warps: int = 4
    num_stages: int = 4
    ctas_per_sm: int = 2
    """Persistent programs per SM the GEMM may use; 0 = one program per tile (not persistent:
    fastest alone, but every tile runs at once, so units finish together and overlap little)."""
    k_unroll: int = 1
    """128-wide K steps per pipelined iteration (used when K / 128 is a multiple of it)."""
    m_inner: bool = False
    """Tile order within an expert. False (served): (m block, n tile), n innermost: a block's
    tiles are consecutive, so blocks finish in order, and the tiles of the blocks past masked_m
    (empty: one atomic, no K loop) spread evenly over the persistent programs. True: (n tile,
    m block), the m blocks that share a weight tile side by side; with a persistent grid whose
    size is a multiple of the blocks per expert, every program then always gets the same m
    block, and at capacity 256 with <= 64 rows only a quarter of the programs have real work
    (several times slower than DeepGEMM there)."""

    def programs(self, sms: int) -> int | None:
        """The grid cap for `grouped_gemm_fp8_signal` on `sms` SMs (None: one per tile)."""
        return None if self.ctas_per_sm == 0 else sms * self.ctas_per_sm


def default_config(expected_m: int) -> SignalGemmConfig:
    """The served launch for `expected_m` rows per expert: this GPU's `fused` table
    (`gpu_tables.producer_tables`; e.g. on the H200 up to 64 rows 8 warps on 64 x 128 tiles,
    two persistent programs per SM: memory-bound, and experts finish in order)."""
    from sglang_overlap.kernels.gpu_tables import producer_tables

    tile = producer_tables().fused_tile(expected_m)
    return SignalGemmConfig(block_m=tile.block_m, block_n=tile.block_n, num_warps=tile.num_warps,
                            num_stages=tile.num_stages, ctas_per_sm=tile.ctas_per_sm)


_KERNELS: dict[str, Any] = {}


def _kernels() -> dict[str, Any]:
    if _KERNELS:
        return _KERNELS
    import triton
    import triton.language as tl

    # counts change with every shape: not specialised, so one compile serves all shapes
    @triton.jit(do_not_specialize=["m_cap", "num_units", "blocks_per_expert", "n_tiles",
                                   "num_progs"])
    def gemm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, d_ptr, masked_m_ptr, sig_ptr,
                    m_cap, n, k, num_units, blocks_per_expert, n_tiles, num_progs,
                    s_ae, s_am, s_ase, s_asm, s_asg, s_be, s_bn, s_bse, s_bsn, s_bsg, s_de, s_dm,
                    SIGNAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, K_UNROLL: tl.constexpr, M_INNER: tl.constexpr):
        # tile t -> (expert, m block, n tile) (SignalGemmConfig.m_inner: (expert, n tile,
        # m block)); experts finish in order either way.
        tiles_per_expert = blocks_per_expert * n_tiles
        for t in range(tl.program_id(0), num_units, num_progs):
            e = t // tiles_per_expert
            rem = t % tiles_per_expert
            if M_INNER:
                nt = rem // blocks_per_expert
                mb = rem % blocks_per_expert
            else:
                mb = rem // n_tiles
                nt = rem % n_tiles
            m_valid = tl.minimum(tl.load(masked_m_ptr + e), m_cap)
            offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_k = tl.arange(0, BLOCK_K)
            row_ok = offs_m < m_valid
            col_ok = offs_n < n
            # an empty tile runs no K steps but still stores nothing and signals
            k_steps = tl.where(mb * BLOCK_M < m_valid, k // BLOCK_K, 0)
            a_ptrs = a_ptr + e * s_ae + offs_m[:, None] * s_am + offs_k[None, :]
            b_ptrs = b_ptr + e * s_be + offs_n[None, :] * s_bn + offs_k[:, None]
            as_ptrs = as_ptr + e * s_ase + offs_m * s_asm
            bs_ptrs = bs_ptr + e * s_bse + (offs_n // 128) * s_bsn
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kk in range(0, k_steps, K_UNROLL):
                for u in tl.static_range(K_UNROLL):
                    ks = kk + u
                    a = tl.load(a_ptrs + ks * BLOCK_K, mask=row_ok[:, None], other=0.0)  # [BM, BK]
                    b = tl.load(b_ptrs + ks * BLOCK_K, mask=col_ok[None, :], other=0.0)  # [BK, BN]
                    sa = tl.load(as_ptrs + ks * s_asg, mask=row_ok, other=0.0)  # [BM]
                    sb = tl.load(bs_ptrs + ks * s_bsg, mask=col_ok, other=0.0)  # [BN]
                    acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
            d_ptrs = d_ptr + e * s_de + offs_m[:, None] * s_dm + offs_n[None, :]
            tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
            if SIGNAL != 0:
                # every thread's stores precede the barrier; the release atomic (one thread)
                # publishes them at gpu scope (cumulativity through bar.sync)
                tl.debug_barrier()
                if SIGNAL == 1:
                    idx = e * blocks_per_expert + mb
                else:
                    idx = e
                tl.atomic_add(sig_ptr + idx, 1, sem="release", scope="gpu")

    _KERNELS["gemm"] = gemm_kernel
    return _KERNELS


def grouped_gemm_fp8_signal(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                            b_scale: torch.Tensor, masked_m: torch.Tensor, out: torch.Tensor, *,
                            config: SignalGemmConfig, signal: torch.Tensor | None = None,
                            layout: SboLayout | None = None, num_programs: int | None = None
                            ) -> None:
    """out[e, :masked_m[e]] = (a[e] * a_scale) @ (b[e] * b_scale)^T, accumulated in fp32 and
    stored as out.dtype; launched on the current stream.

    Arguments:
        a: `torch.Tensor` `[E, M, K]` `torch.float8_e4m3fn`, K contiguous; K a multiple of 128.
        a_scale: `torch.Tensor` `[E, M, K / 128]` `torch.float32`, one scale per row per 128
            channels of K; any strides.
        b: `torch.Tensor` `[E, N, K]` `torch.float8_e4m3fn`, K contiguous.
        b_scale: `torch.Tensor` `[E, ceil(N / 128), K / 128]` `torch.float32`, one scale per
            128 x 128 block; any strides.
        masked_m: `torch.Tensor` `[E]` `torch.int32`: valid rows per expert, each <= M.
        out: `torch.Tensor` `[E, M, N]` `torch.bfloat16`, N contiguous, written in place; rows
            past masked_m[e] are untouched.
        config: the tile and launch shape (`down_gemm.fused_config`).
        signal: None, or the zeroed buffer of `signals.new_signal(layout)`:
            `[E * ceil(M / block_m)]` int32 per block or `[E]` uint32 per expert. Each tile
            bumps its unit's counter with a gpu-scope release after its store (tiles past
            masked_m included), so every unit reaches `layout.expect_value` exactly once.
        layout: the `SboLayout` of `signal` (required with it): E, M, N and the tile shape of
            `config`.
        num_programs: caps the persistent grid (None: one program per tile), leaving SMs to a
            consumer.

    Raises:
        ValueError: shapes, strides, tile or layout that do not match (the message says which).
    """
    e, m_cap, k = a.shape
    n = b.shape[1]
    if k % BLOCK_K or b.shape != (e, n, k) or out.shape != (e, m_cap, n):
        raise ValueError(f"shapes do not match [E, M, K] x [E, N, K] -> [E, M, N] with "
                         f"K % 128 == 0 (got a={tuple(a.shape)} b={tuple(b.shape)} "
                         f"out={tuple(out.shape)})")
    if a.stride(-1) != 1 or b.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("a, b and out need a contiguous last dimension")
    if not (128 % config.block_n == 0 or config.block_n % 128 == 0):
        raise ValueError(f"block_n must divide 128 or be a multiple of it (got {config.block_n})")
    blocks = -(-m_cap // config.block_m)
    n_tiles = -(-n // config.block_n)
    mode = 0
    if signal is not None:
        if layout is None:
            raise ValueError("a signal buffer needs its SboLayout")
        _check_layout(layout, e, m_cap, n, config, blocks, n_tiles)
        mode = 1 if layout.granularity == "block" else 2
        if signal.shape != layout.signal_shape:
            raise ValueError(f"signal shape {tuple(signal.shape)} != layout {layout.signal_shape}")
        signal = signal.view(torch.int32)
    units = e * blocks * n_tiles
    progs = units if num_programs is None else max(1, min(units, num_programs))
    if units == 0:
        return
    _kernels()["gemm"][(progs,)](
        a, a_scale, b, b_scale, out, masked_m, signal if signal is not None else masked_m,
        m_cap, n, k, units, blocks, n_tiles, progs,
        a.stride(0), a.stride(1), a_scale.stride(0), a_scale.stride(1), a_scale.stride(2),
        b.stride(0), b.stride(1), b_scale.stride(0), b_scale.stride(1), b_scale.stride(2),
        out.stride(0), out.stride(1),
        SIGNAL=mode, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=BLOCK_K,
        K_UNROLL=config.k_unroll if (k // BLOCK_K) % config.k_unroll == 0 else 1,
        M_INNER=config.m_inner,
        num_warps=config.num_warps, num_stages=config.num_stages)


def _check_layout(layout: SboLayout, e: int, m_cap: int, n: int, config: SignalGemmConfig,
                  blocks: int, n_tiles: int) -> None:
    want = {"num_local_experts": e, "capacity": m_cap, "hidden": n, "block_m": config.block_m,
            "block_n": config.block_n, "blocks_per_expert": blocks, "n_tiles": n_tiles}
    got = {key: getattr(layout, key) for key in want}
    if got != want:
        raise ValueError(f"SboLayout does not match the GEMM: layout {got}, GEMM {want}")
