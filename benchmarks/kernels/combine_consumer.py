"""A combine-side consumer of SBO signals: the local part of combine, on a few SMs.

It waits (gpu-scope acquire polls) for each unit's counter to reach its final value, then
weighted-reduces that unit's rows of the down GEMM output into the token rows they came from:
`out[src[e, r]] += weight[e, r] * down[e, r]`. Launched on a second stream before the GEMM it
proves ordering (a read before the unit is final sees the NaN the output was poisoned with) and
measures how much of combine hides under the GEMM on one GPU. A unit that never becomes final sets
`error[0] = 1` after a bounded spin instead of hanging the GPU.

Legend: E local experts, M capacity rows per expert, H hidden, T tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sglang_overlap.planning.sbo_layout import SboLayout

DEFAULT_MAX_SPINS = 1 << 24  # about a second of polling on an H200, far beyond any GEMM here

_KERNEL: Any = None


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["m_cap", "num_units", "blocks_per_expert", "expect",
                                   "max_spins", "num_progs"])
    def consumer_kernel(down_ptr, sig_ptr, masked_m_ptr, src_ptr, w_ptr, out_ptr, err_ptr,
                        m_cap, h, s_de, s_dm, s_out, num_units, blocks_per_expert, expect,
                        max_spins, num_progs,
                        PER_EXPERT: tl.constexpr, WAIT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
        for u in range(tl.program_id(0), num_units, num_progs):
            if PER_EXPERT:
                e = u
                lo = 0
                hi = tl.load(masked_m_ptr + e)
            else:
                e = u // blocks_per_expert
                lo = (u % blocks_per_expert) * BLOCK_M
                hi = tl.minimum(lo + BLOCK_M, tl.load(masked_m_ptr + e))
            hi = tl.minimum(hi, m_cap)
            if WAIT:
                seen = tl.atomic_add(sig_ptr + u, 0, sem="acquire", scope="gpu")
                spins = seen * 0
                while (seen < expect) & (spins < max_spins):
                    seen = tl.atomic_add(sig_ptr + u, 0, sem="acquire", scope="gpu")
                    spins += 1
                ok = seen >= expect
                if seen < expect:
                    tl.atomic_xchg(err_ptr, 1)
            else:
                ok = True
            if ok:
                for r0 in range(lo, hi, BLOCK_R):
                    rows = r0 + tl.arange(0, BLOCK_R)
                    rmask = rows < hi
                    tok = tl.load(src_ptr + e * m_cap + rows, mask=rmask, other=0)
                    wgt = tl.load(w_ptr + e * m_cap + rows, mask=rmask, other=0.0)
                    for h0 in range(0, h, BLOCK_H):
                        cols = h0 + tl.arange(0, BLOCK_H)
                        msk = rmask[:, None] & (cols[None, :] < h)
                        # .cg: read through L2, never a stale L1 line of the poisoned output
                        v = tl.load(down_ptr + e * s_de + rows[:, None] * s_dm + cols[None, :],
                                    mask=msk, other=0.0, cache_modifier=".cg")
                        tl.atomic_add(out_ptr + tok[:, None] * s_out + cols[None, :],
                                      v.to(tl.float32) * wgt[:, None], mask=msk, sem="relaxed")

    _KERNEL = consumer_kernel
    return _KERNEL


def combine_consume(down: torch.Tensor, masked_m: torch.Tensor, src_token: torch.Tensor,
                    weight: torch.Tensor, out: torch.Tensor, *, signal: torch.Tensor | None,
                    layout: SboLayout, num_programs: int, error: torch.Tensor,
                    wait: bool = True, max_spins: int = DEFAULT_MAX_SPINS) -> None:
    """Wait for each unit of `layout`, then `out[src_token[e, r]] += weight[e, r] * down[e, r]`.

    down: `[E, M, H]` bf16 (the down GEMM output, written concurrently); masked_m: `[E]` int32;
    src_token: `[E, M]` int32 token row of each expert row; weight: `[E, M]` fp32 top-k weight;
    out: `[T, H]` fp32 accumulator (zero it first); signal: counters in `layout`'s form;
    error: `[1]` int32, set to 1 if a unit never reached `layout.expect_value`.
    `wait=False` reads without waiting: the negative control that ordering tests must catch.
    """
    e, m_cap, h = down.shape
    if (e, m_cap) != (layout.num_local_experts, layout.capacity) or h != layout.hidden:
        raise ValueError(f"down {tuple(down.shape)} does not match the layout "
                         f"(E={layout.num_local_experts}, M={layout.capacity}, H={layout.hidden})")
    if src_token.shape != (e, m_cap) or weight.shape != (e, m_cap) or out.shape[1] != h:
        raise ValueError(f"src_token/weight must be [E, M]={e, m_cap} and out [T, {h}] (got "
                         f"{tuple(src_token.shape)}, {tuple(weight.shape)}, {tuple(out.shape)})")
    if wait and signal is None:
        raise ValueError("wait=True needs the signal buffer")
    per_expert = layout.granularity == "expert"
    units = e if per_expert else e * layout.blocks_per_expert
    sig = signal.view(torch.int32) if signal is not None else error
    progs = max(1, min(units, num_programs))
    _kernel()[(progs,)](
        down, sig, masked_m, src_token, weight, out, error, m_cap, h, down.stride(0),
        down.stride(1), out.stride(0), units, layout.blocks_per_expert, layout.expect_value,
        max_spins, progs, PER_EXPERT=per_expert, WAIT=wait, BLOCK_M=layout.block_m,
        BLOCK_R=16, BLOCK_H=512, num_warps=8)


def combine_reference(down: torch.Tensor, masked_m: torch.Tensor, src_token: torch.Tensor,
                      weight: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The same reduction in torch (fp32), from a finished `down`: `[T, H]`."""
    e, m_cap, h = down.shape
    valid = torch.arange(m_cap, device=down.device)[None, :] < masked_m[:, None].long()  # [E, M]
    rows = down.float()[valid] * weight[valid][:, None]  # [R, H]
    out = torch.zeros((num_tokens, h), dtype=torch.float32, device=down.device)
    out.index_add_(0, src_token[valid].long(), rows)
    return out
