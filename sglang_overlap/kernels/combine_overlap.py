"""The SBO combine overlap as each DeepEP tree reads it: kwargs, the signal it polls, its SMs.

Two forms of `Buffer.low_latency_combine(..., overlap=True, ...)` exist (read in their csrc,
`csrc/kernels/internode_ll.cu`):

per_expert (deepseek-ai/DeepEP hybrid-ep @ 94a9f8f, the sgl-deep-ep 0.1.2.post1 API):
    `src_signals` [E_local] uint32; before sending expert e the send kernel spins (no timeout,
    `nanosleep` 20 ns) until `ld.acquire.gpu(src_signals[e]) == src_signal_expect_value`, for
    every local expert, empty ones included. Send-only launches (`return_recv_hook=True`) use
    `max(ceil(E / wg), ceil(T / ceil(T / 32)))` CTAs with wg = ceil(E / 32): at most 32 SMs,
    fixed in the tree ("num_device_sms = 32").
per_block (deepseek-ai/DeepEP antgroup-opt @ 76f0271, what the supported SGLang calls on Hopper):
    `comp_signal` int32 `[E_local * ceil(C / block_m)]`, C = num_max_dispatch_tokens_per_rank *
    num_ranks; signal `e * ceil(C / block_m) + b` covers rows [b * block_m, (b + 1) * block_m)
    of expert e; the host asserts the length E_local * ceil(C / 64) whatever block_m
    (csrc/deep_ep.cpp:1721), so only block_m 64 agrees with it. The send spins (no timeout)
    until `ld.acquire.gpu == threshold` for b < ceil(packed_recv_count[e] / block_m), and
    waits on nothing for an empty expert. It runs on exactly `num_sms` CTAs (one warp group
    of 32 warps each) and only as a send-only launch (`return_recv_hook=True`); `threshold > 0`
    is asserted on the host.

Both kernels are cooperative launches of 1024-thread CTAs with ~200 KB of shared memory each:
one CTA fills an SM, so the send holds exactly its CTA count of SMs and the signal producer
(the down GEMM) must fit on the others. `combine_send_num_sms` gives that count.

Both compare with `==`: a counter that overshoots its final value hangs the send as surely as
one that never reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglang_overlap.planning.sbo_path import CombineForm

if TYPE_CHECKING:
    import torch

    from sglang_overlap.kernels.package_source import FunctionParams
    from sglang_overlap.planning.sbo_layout import SboLayout

HYBRID_SEND_MAX_SMS = 32  # hybrid-ep's send-only combine: "num_device_sms = 32"
# antgroup-opt csrc/deep_ep.cpp:1721 asserts comp_signal.size(0) == E_local * ceil(C / 64)
# whatever block_m is passed, while the kernel indexes e * ceil(C / block_m) + b: only 64-row
# blocks are laid out the same both ways (SGLang's MIN_BLOCK_M = 64 sizes it so too).
PER_BLOCK_SIGNAL_ROWS = 64
FORM_GRANULARITY = {"per_expert": "expert", "per_block": "block"}


def combine_overlap_kwargs(form: CombineForm | None, *, signal: torch.Tensor | None,
                           expect_value: int = 0, packed_recv_count: torch.Tensor | None = None,
                           block_m: int | None = None, threshold: int | None = None,
                           num_sms: int | None = None) -> dict[str, Any]:
    """Keyword arguments for `Buffer.low_latency_combine` in `form`; {} without a signal.

    per_expert (sgl-deep-ep 0.1.2.post1):
        overlap=True, src_signals: [E_local] uint32 counters, src_signal_expect_value: the value
        a counter holds once its expert's rows are final (SboLayout.expect_value).
    per_block (DeepEP's Hopper fork):
        overlap=True, packed_recv_count: [E_local] int32 (dispatch's recv_count),
        comp_signal: [E_local * ceil(C / block_m)] int32, block_m, threshold (a block's final
        counter value), num_sms (SMs the combine send may use).
    """
    if signal is None:
        return {}
    if form == "per_expert":
        return dict(overlap=True, src_signals=signal, src_signal_expect_value=expect_value)
    if form == "per_block":
        missing = [n for n, v in (("packed_recv_count", packed_recv_count), ("block_m", block_m),
                                  ("threshold", threshold), ("num_sms", num_sms)) if v is None]
        if missing:
            raise ValueError(f"per-block combine overlap needs {', '.join(missing)}")
        return dict(overlap=True, packed_recv_count=packed_recv_count, comp_signal=signal,
                    block_m=block_m, threshold=threshold, num_sms=num_sms)
    raise ValueError(f"no combine overlap form to pass a signal in (form={form!r})")


def check_combine_call(params: FunctionParams, kwargs: dict[str, Any]) -> None:
    """Raise ValueError (at start-up, not a TypeError mid-serving) unless `low_latency_combine`
    with these keyword arguments binds to the declared parameters."""
    base = dict(x=None, topk_idx=None, topk_weights=None, handle=None, async_finish=False,
                return_recv_hook=True)
    try:
        params.signature().bind(None, **base, **kwargs)
    except TypeError as exc:
        raise ValueError(f"deep_ep low_latency_combine ({params.where}) does not accept "
                         f"{sorted(kwargs)}: {exc}") from exc


def combine_send_num_sms(form: CombineForm, *, num_experts: int, num_tokens: int,
                         comm_num_sms: int) -> int:
    """SMs the overlapped (send-only) combine holds while it waits: per_block runs on the
    `num_sms` it is given (`comm_num_sms`); per_expert's grid is fixed by the tree (<= 32).
    `num_experts` is the global E, `num_tokens` this rank's T."""
    if form == "per_block":
        if comm_num_sms < 1:
            raise ValueError(f"per-block combine send needs num_sms >= 1 (got {comm_num_sms})")
        return comm_num_sms
    groups = -(-num_experts // HYBRID_SEND_MAX_SMS)
    per_sm = -(-num_tokens // HYBRID_SEND_MAX_SMS)
    token_sms = -(-num_tokens // per_sm) if num_tokens else 0
    return max(-(-num_experts // groups), token_sms)


def check_layout_for_combine(layout: SboLayout, form: CombineForm, *,
                             num_max_dispatch_tokens_per_rank: int, num_ranks: int) -> None:
    """Raise ValueError unless the combine of `form` reads exactly `layout`'s signal: the
    granularity, dtype, length, final value and the capacity the kernel indexes with."""
    cap = num_max_dispatch_tokens_per_rank * num_ranks
    problems = []
    if layout.granularity != FORM_GRANULARITY[form]:
        problems.append(f"granularity {layout.granularity} (the {form} form reads "
                        f"{FORM_GRANULARITY[form]} counters)")
    if layout.capacity != cap:
        problems.append(f"capacity {layout.capacity} != num_max_dispatch_tokens_per_rank * "
                        f"num_ranks = {cap} (the kernel's row stride per expert)")
    if form == "per_block":
        want = layout.num_local_experts * -(-cap // PER_BLOCK_SIGNAL_ROWS)
        if layout.block_m != PER_BLOCK_SIGNAL_ROWS:
            problems.append(f"block_m {layout.block_m}: the tree sizes comp_signal for "
                            f"{PER_BLOCK_SIGNAL_ROWS}-row blocks and indexes it with block_m")
        if layout.signal_dtype != "int32" or layout.signal_shape != (want,):
            problems.append(f"signal {layout.signal_dtype}{list(layout.signal_shape)}; the "
                            f"kernel reads int32[{want}] = E_local * ceil({cap} / "
                            f"block_m={layout.block_m})")
    elif layout.signal_dtype != "uint32" or layout.signal_shape != (layout.num_local_experts,):
        problems.append(f"signal {layout.signal_dtype}{list(layout.signal_shape)}; the kernel "
                        f"reads uint32[{layout.num_local_experts}]")
    if layout.expect_value < 1:
        problems.append(f"final value {layout.expect_value} (must be > 0)")
    if problems:
        raise ValueError(f"SBO signal layout does not match the {form} combine: "
                         + "; ".join(problems))


def layout_overlap_kwargs(form: CombineForm, layout: SboLayout, signal: torch.Tensor,
                          packed_recv_count: torch.Tensor, *, num_sms: int) -> dict[str, Any]:
    """`combine_overlap_kwargs` for a signal laid out by `layout` (block_m and threshold from
    the layout, so the combine waits for exactly the values the GEMM writes)."""
    dtype = str(signal.dtype).removeprefix("torch.")
    if tuple(signal.shape) != layout.signal_shape or dtype != layout.signal_dtype:
        raise ValueError(f"signal tensor {dtype}{list(signal.shape)} is not the layout's "
                         f"{layout.signal_dtype}{list(layout.signal_shape)}")
    return combine_overlap_kwargs(form, signal=signal, expect_value=layout.expect_value,
                                  packed_recv_count=packed_recv_count, block_m=layout.block_m,
                                  threshold=layout.expect_value, num_sms=num_sms)


__all__ = [
    "FORM_GRANULARITY",
    "HYBRID_SEND_MAX_SMS",
    "PER_BLOCK_SIGNAL_ROWS",
    "check_combine_call",
    "check_layout_for_combine",
    "combine_overlap_kwargs",
    "combine_send_num_sms",
    "layout_overlap_kwargs",
]
