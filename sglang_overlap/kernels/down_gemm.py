"""THE SBO down GEMM: the one entry that both the SGLang glue and the DeepGEMM expert runner call.

A signal-emitting down GEMM tells the combine send which output units are final while it still
runs. Three producers, one module each, named by `SignalPlan.path`:

- deepgemm (`signal_deepgemm/`): DeepGEMM's own SM90 masked kernel with the plugin's signal
  patch, built from the installed deep_gemm's headers (the releases of
  `signal_deepgemm.RELEASES`);
- fused (`signal_fused.py`): the plugin's Triton fp8 masked GEMM, one release atomic per tile;
- sliced (`signal_sliced.py`): unmodified DeepGEMM per slice of experts, each slice followed by
  a store of its units' final values.

`choose_signal_path` picks one per shape; the layout functions here are the single place the
signal buffer of a served down GEMM is laid out, with the chosen producer's tiles;
`signal_down_gemm` runs it. The tiles, signal timing and fallback choices are data per GPU
(`sglang_overlap/profiles/producer-<GPU>.json`, read by `kernels.gpu_tables`; each table says
where and on which release it was measured); this module holds the rules.

Legend: E local experts, C capacity rows per expert, K = moe intermediate, N = hidden.
"""


from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Literal

import torch

from sglang_overlap.kernels.combine_overlap import (
    FORM_GRANULARITY,
    HYBRID_SEND_MAX_SMS,
    PER_BLOCK_SIGNAL_ROWS,
    check_layout_for_combine,
    combine_send_num_sms,
)
from sglang_overlap.kernels.gpu_tables import producer_tables
from sglang_overlap.kernels.signal_deepgemm import (
    DgSignalConfig,
    DgSignalError,
    block_n_candidates,
    max_stages,
)
from sglang_overlap.kernels.signal_deepgemm import probe as probe_deepgemm_signal
from sglang_overlap.kernels.signal_fused import (
    SignalGemmConfig,
    default_config,
    grouped_gemm_fp8_signal,
)
from sglang_overlap.kernels.triton_versions import installed_triton, kernel_problem
from sglang_overlap.planning.sbo_layout import Granularity, SboLayout, plan_sbo_layout
from sglang_overlap.planning.sbo_path import CombineForm

log = logging.getLogger(__name__)

# DeepGEMM's masked GEMM writes wrong rows at per-expert capacity 16 / 32 (sgl-deep-gemm
# 0.1.4.post1): DeepGEMM runs only where the capacity is a multiple of this.
DEEPGEMM_CAPACITY_ALIGN = 64

@dataclass(frozen=True)
class SignalPlan:
    """How the down GEMM emits SBO signals."""

    path: Literal["deepgemm", "fused", "sliced"]
    """deepgemm: DeepGEMM's kernel with the signal patch; fused: the Triton kernel's per-tile
    atomics; sliced: DeepGEMM launches per expert slice."""
    slice_experts: int = 0
    """Experts per DeepGEMM launch (sliced only)."""
    streams: int = 1
    """Streams the slices alternate over (sliced only)."""
    why: str = ""
    """One line: the measurement or constraint behind the choice."""
    dg_config: DgSignalConfig | None = None
    """The patched kernel's tile (deepgemm only)."""


_DG_SIGNAL_UNAVAILABLE: list[str] = []  # why the patched producer cannot run (cached, logged once)


def deepgemm_signal_unavailable() -> str | None:
    """None when the patched DeepGEMM producer can run here, else why not (logged once per
    process: the Triton and sliced producers are served instead)."""
    if not _DG_SIGNAL_UNAVAILABLE:
        why = probe_deepgemm_signal()
        _DG_SIGNAL_UNAVAILABLE.append(why or "")
        if why:
            log.info("sglang-overlap SBO down GEMM: the patched DeepGEMM producer is unavailable "
                     "(%s); serving the Triton / sliced producers", why)
    return _DG_SIGNAL_UNAVAILABLE[0] or None


_FUSED_UNAVAILABLE: list[str] = []  # why the installed triton cannot build the fused producer


def fused_unavailable() -> str | None:
    """None when the installed triton builds the fused Triton producer
    (`triton_versions.kernel_problem`), else why not, naming the version and what to install
    (logged once per process: DeepGEMM slices serve where the tables choose it)."""
    if not _FUSED_UNAVAILABLE:
        why = kernel_problem("fused", installed_triton())
        _FUSED_UNAVAILABLE.append(why or "")
        if why:
            log.warning("sglang-overlap SBO down GEMM: %s; DeepGEMM slices serve where the "
                        "producer tables choose the fused producer", why)
    return _FUSED_UNAVAILABLE[0] or None


def _deepgemm_signal_failed(exc: Exception) -> None:
    _DG_SIGNAL_UNAVAILABLE[:] = [f"failed at run time: {exc}"]
    log.warning("sglang-overlap SBO down GEMM: the patched DeepGEMM producer failed (%s); "
                "serving the Triton / sliced producers from now on", exc)


def dg_signal_config(num_local_experts: int, expected_m: int, capacity: int,
                     k: int = 2048) -> DgSignalConfig:
    """The patched kernel's served config for this shape: this GPU's `dg_tiles` bucket
    (`gpu_tables.producer_tables`): its tile, TMA multicast and signal timing, block_m 64 where
    128-row tiles do not divide the capacity, the most stages that fit K."""
    tile = producer_tables().dg_tile(num_local_experts, expected_m)
    block_m = tile.block_m if capacity % tile.block_m == 0 else 64
    return DgSignalConfig(block_m, tile.block_n, max_stages(block_m, tile.block_n, k),
                          eager=tile.signal == "eager", store_warp=tile.signal == "store_warp",
                          multicast=tile.multicast, multicast_on_a=tile.multicast_on_a)


def launchable(config: DgSignalConfig, n: int, num_sms: int) -> DgSignalConfig:
    """`config`, without TMA multicast where it cannot launch (an odd SM count, or an odd number
    of n tiles at this N): the table's tile was measured at one N and SM count."""
    try:
        config.check_launch(n, num_sms)
    except ValueError:
        return replace(config, multicast=1, multicast_on_a=False)
    return config


def dg_config_for_layout(plan: SignalPlan, layout: SboLayout, k: int) -> DgSignalConfig | None:
    """The patched kernel's config whose tiles count `layout`'s units: the plan's tile when the
    layout was laid out for it (`plan_tiles`), else one with the layout's block_n (and block_m
    per expert); None when no legal tile does (the caller then runs DeepGEMM slices)."""
    assert plan.dg_config is not None
    block_m, block_n = plan.dg_config.block_m, layout.block_n
    if layout.granularity == "expert":
        block_m = layout.block_m
    elif block_m % layout.block_m:
        block_m = layout.block_m
    if (block_n not in block_n_candidates() or block_m not in (64, 128)
            or layout.capacity % block_m):
        return None
    if (block_m, block_n) == (plan.dg_config.block_m, plan.dg_config.block_n):
        return launchable(plan.dg_config, layout.hidden, layout.compute_num_sms)
    return DgSignalConfig(block_m, block_n, max_stages(block_m, block_n, k),
                          eager=plan.dg_config.eager, store_warp=plan.dg_config.store_warp)


def choose_signal_path(num_local_experts: int, expected_m: int, capacity: int) -> SignalPlan:
    """The signal-emitting down GEMM for this shape (DeepSeek-V3 down projection, N 7168,
    K 2048):

    - deepgemm wherever it can run (a covered deep_gemm release, nvcc, capacity a multiple of
      64), the fastest producer at every measured shape, with this GPU's `dg_tiles`;
    - fused for capacities DeepGEMM mis-computes (`DEEPGEMM_CAPACITY_ALIGN`);
    - otherwise this GPU's `fallback` table: fused or DeepGEMM slices (E / slice_div experts
      per launch, on 1 or 2 streams) by E, rows and whether the buffer is padded past the rows.
    Where the installed triton cannot build the fused producer (`fused_unavailable`), DeepGEMM
    slices (E / 4, two streams) serve in its place, and a capacity only it computes raises
    ValueError naming the triton version and what to install."""
    e = num_local_experts
    tables = producer_tables()
    if capacity % DEEPGEMM_CAPACITY_ALIGN == 0 and deepgemm_signal_unavailable() is None:
        return SignalPlan("deepgemm", why=f"{tables.gpu}: DeepGEMM's kernel with the signal patch "
                          "is the fastest producer at every measured shape",
                          dg_config=dg_signal_config(e, expected_m, capacity))
    if capacity % DEEPGEMM_CAPACITY_ALIGN:
        why = (f"capacity {capacity} is not a multiple of {DEEPGEMM_CAPACITY_ALIGN} (DeepGEMM "
               "mis-computes it)")
        fused_why = fused_unavailable()
        if fused_why is not None:
            raise ValueError(f"sglang-overlap SBO down GEMM: {why} and only the fused Triton "
                             f"producer computes it, but {fused_why} (or make "
                             "num_max_dispatch_tokens_per_rank x ranks a multiple of "
                             f"{DEEPGEMM_CAPACITY_ALIGN})")
        return SignalPlan("fused", why=why)
    choice = tables.fallback_choice(e, expected_m, capacity)
    why = f"{tables.gpu}: {choice.why} (E {e}, {expected_m} rows, capacity {capacity})"
    if choice.path == "fused":
        fused_why = fused_unavailable()
        if fused_why is None:
            return SignalPlan("fused", why=why)
        return SignalPlan("sliced", max(1, e // 4), 2, why=f"{why}; but {fused_why}: DeepGEMM "
                          "slices (E / 4 on two streams) instead")
    return SignalPlan("sliced", max(1, e // choice.slice_div), choice.streams, why=why)


def plan_tiles(plan: SignalPlan, expected_m: int, granularity: Granularity) -> tuple[int, int]:
    """(block_m, block_n) of the signal units `plan`'s producer counts: the patched kernel's
    tile (per block: 64-row units, each tile covering one or two), else the fused kernel's for
    `expected_m` (the sliced path marks whole experts, so any unit size serves it)."""
    if plan.dg_config is not None:
        block_m = PER_BLOCK_SIGNAL_ROWS if granularity == "block" else plan.dg_config.block_m
        return block_m, plan.dg_config.block_n
    config = default_config(expected_m)
    return config.block_m, config.block_n


def signal_layout(*, num_local_experts: int, capacity: int, hidden: int, expected_m: int,
                  granularity: Granularity, num_sms: int, comm_num_sms: int) -> SboLayout:
    """The signal buffer of a served down GEMM `[E, C, K] x [E, N, K] -> [E, C, N]`: units follow
    the tiles of the producer `choose_signal_path` picks for this shape (`plan_tiles`)."""
    plan = choose_signal_path(num_local_experts, expected_m, capacity)
    block_m, block_n = plan_tiles(plan, expected_m, granularity)
    return plan_sbo_layout(num_local_experts=num_local_experts, capacity=capacity,
                           block_m=block_m, block_n=block_n, hidden=hidden,
                           num_sms=num_sms, comm_num_sms=comm_num_sms, granularity=granularity)


def combine_signal_layout(form: CombineForm, *, num_local_experts: int, world_size: int,
                          num_max_dispatch_tokens_per_rank: int, num_tokens: int, hidden: int,
                          expected_m: int, num_sms: int, comm_num_sms: int) -> SboLayout:
    """`signal_layout` for DeepEP's combine in `form`, checked against what that tree's send
    kernel reads (`combine_overlap.check_layout_for_combine`): capacity C = N * W rows per expert,
    per_block int32 `[E_local * ceil(C / 64)]` in 64-row blocks (antgroup-opt asserts that size
    whatever block_m it is given, so the plugin's tiles are 64 rows there), final at `threshold`;
    per_expert uint32 `[E_local]`.

    SMs: the GEMM keeps off those the send may hold - `comm_num_sms` per block (its `num_sms`);
    per expert the tree's grid (`combine_send_num_sms`), at most `HYBRID_SEND_MAX_SMS`, reserved
    whatever T (one split and one set of GEMM kernels per shape) - and runs on an even count
    (sgl-deep-gemm 0.1.4 asserts num_sms % 2 == 0: TMA multicast pairs SMs)."""
    held = combine_send_num_sms(form, num_experts=num_local_experts * world_size,
                                num_tokens=num_tokens, comm_num_sms=comm_num_sms)
    if form == "per_expert":
        held = max(held, HYBRID_SEND_MAX_SMS)
    usable = held + (num_sms - held) // 2 * 2  # the GEMM's share rounded down to even
    capacity = num_max_dispatch_tokens_per_rank * world_size
    granularity: Granularity = FORM_GRANULARITY[form]  # type: ignore[assignment]
    plan = choose_signal_path(num_local_experts, expected_m, capacity)
    block_m, block_n = plan_tiles(plan, expected_m, granularity)
    if form == "per_block":
        block_m = PER_BLOCK_SIGNAL_ROWS
    layout = plan_sbo_layout(num_local_experts=num_local_experts, capacity=capacity,
                             block_m=block_m, block_n=block_n, hidden=hidden,
                             num_sms=usable, comm_num_sms=held, granularity=granularity)
    check_layout_for_combine(layout, form, num_max_dispatch_tokens_per_rank=(
        num_max_dispatch_tokens_per_rank), num_ranks=world_size)
    return layout


def fused_config(layout: SboLayout, expected_m: int) -> SignalGemmConfig:
    """The fused kernel's launch for `layout`'s tiles (warps / stages tuned for `expected_m`).
    Tile order: n tiles innermost, except where the rows fill every m block and there are 32
    experts or more (`SignalGemmConfig.m_inner`)."""
    base = default_config(expected_m)
    full = -(-max(1, expected_m) // layout.block_m) >= layout.blocks_per_expert
    return SignalGemmConfig(layout.block_m, layout.block_n, base.num_warps, base.num_stages,
                            max(1, base.ctas_per_sm), base.k_unroll,
                            m_inner=full and layout.num_local_experts >= 32)


def prepare_signal_down_gemm(layout: SboLayout, expected_m: int, k: int,
                             device: torch.device | int) -> SignalPlan:
    """Build and load, without launching, the producer `signal_down_gemm` will run for
    `layout` (the patched DeepGEMM kernel is one module per shape). Call it before launching a
    combine send that spins on the signal: loading a module waits for the device to go idle,
    which it never does while the send spins on a producer not yet loaded (a hang). Returns the
    plan."""
    plan = choose_signal_path(layout.num_local_experts, expected_m, layout.capacity)
    if plan.path != "deepgemm":
        return plan
    from sglang_overlap.kernels import signal_deepgemm

    config = dg_config_for_layout(plan, layout, k)
    if config is None:
        return plan
    try:
        signal_deepgemm.load(config, layout, num_groups=layout.num_local_experts,
                             n=layout.hidden, k=k, num_sms=layout.compute_num_sms,
                             device=device)
    except DgSignalError as exc:
        _deepgemm_signal_failed(exc)
    return plan


def host_ordered_plan(num_local_experts: int) -> SignalPlan:
    """The producer for operands off CUDA (a device that runs each operation as the host issues
    it, e.g. the CPU): DeepGEMM slices on one stream, each slice's signal stored after it."""
    return SignalPlan("sliced", max(1, num_local_experts // 4), 1,
                      why="no CUDA device: the Triton and patched DeepGEMM producers need one; "
                      "DeepGEMM slices with their stores in host order")


def signal_down_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                     b_scale: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor,
                     expected_m: int, *, signal: torch.Tensor, layout: SboLayout,
                     compute_num_sms: int | None = None,
                     plan: SignalPlan | None = None) -> SignalPlan:
    """The SBO down GEMM: `out[e, :masked_m[e]] = a[e, :masked_m[e]] @ b[e]^T` per local expert,
    fp8 with DeepGEMM's block scales (recipe 1x128 activations, 128x128 weights), raising
    `signal` unit by unit as the output rows become final, so a combine send can take them
    while the GEMM still runs. Launched on the current stream, on `compute_num_sms` SMs; CUDA
    graphs capture it.

    Arguments:
        a: `torch.Tensor` `[E, C, K]` `torch.float8_e4m3fn`, contiguous: the SiLU-and-mul output
            of each expert's rows (C = capacity rows per local expert, K = moe intermediate
            size, a multiple of 128).
        a_scale: `torch.Tensor` `[E, C, K / 128]` `torch.float32`: one scale per row per 128
            channels of K; any strides (the MN-major TMA-aligned layout `fp8.silu_and_mul_quant`
            writes avoids a copy). UE8M0 scales are refused (Blackwell only).
        b: `torch.Tensor` `[E, N, K]` `torch.float8_e4m3fn`, contiguous: the down-projection
            weights (N = hidden size), K-major.
        b_scale: `torch.Tensor` `[E, ceil(N / 128), K / 128]` `torch.float32`, contiguous: one
            scale per 128 x 128 weight block.
        out: `torch.Tensor` `[E, C, N]` `torch.bfloat16`, contiguous, written in place: rows
            [0, masked_m[e]) of expert e; rows past masked_m[e] are unspecified.
        masked_m: `torch.Tensor` `[E]` `torch.int32` on the device: valid rows per expert, each
            <= C (DeepEP's `packed_recv_count`).
        expected_m: host int, the expected rows per expert: a tiling hint and the producer
            tables' key (pass the value `layout` was built with); results do not depend on it.
        signal: `torch.Tensor` of `layout.signal_shape`, zeroed (`signals.new_signal(layout)`):
            `[E * ceil(C / layout.block_m)]` int32 per row block or `[E]` uint32 per expert.
            Every unit reaches `layout.expect_value` exactly once, after the rows it covers are
            in memory (on CUDA a gpu-scope release), empty experts included.
        layout: the `SboLayout` for this E, C and N whose units count the producer's tiles
            (`signal_layout` / `combine_signal_layout`).
        compute_num_sms: SMs the GEMM may occupy (default: `layout.compute_num_sms`); the rest
            stay free for the combine send.
        plan: the producer to run (default: `choose_signal_path` for the shape); `layout` must
            then count its tiles (`plan_tiles`). Operands off CUDA always run
            `host_ordered_plan` (DeepGEMM slices in host order; they mark whole experts, so
            they serve every layout).

    Returns:
        plan: the `SignalPlan` that ran. It differs from the one asked for where the patched
            DeepGEMM producer cannot count `layout` or fails to build or launch: DeepGEMM slices
            run instead (after a failure, for the rest of the process).

    Raises:
        ValueError: scales that are not float32.
    """
    from sglang_overlap.kernels.deepgemm import num_sms_scope
    from sglang_overlap.kernels.signal_sliced import sliced_masked_gemm_signal

    if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
        raise ValueError("the SBO signal GEMM needs fp32 block scales (1x128 / 128x128); got "
                         f"{a_scale.dtype} / {b_scale.dtype} (UE8M0 scales are Blackwell-only)")
    sms = compute_num_sms or layout.compute_num_sms
    if a.device.type != "cuda":
        plan = host_ordered_plan(layout.num_local_experts)
    elif plan is None:
        plan = choose_signal_path(layout.num_local_experts, expected_m, a.shape[1])
    if plan.path == "deepgemm":
        from sglang_overlap.kernels import signal_deepgemm

        config = dg_config_for_layout(plan, layout, a.shape[2])
        try:
            if config is not None:
                config = launchable(config, b.shape[1], sms)
                signal_deepgemm.masked_gemm_signal(a, a_scale, b, b_scale, out, masked_m,
                                                   config=config, num_sms=sms, signal=signal,
                                                   layout=layout)
                return SignalPlan("deepgemm", why=plan.why, dg_config=config)
        except DgSignalError as exc:  # nvcc or the driver refused: never again this process
            _deepgemm_signal_failed(exc)
        plan = SignalPlan("sliced", max(1, layout.num_local_experts // 4), 2,
                          why="a layout the patched DeepGEMM tiles cannot count, or its "
                          "failure: DeepGEMM slices mark any layout")
    if plan.path == "sliced":
        with num_sms_scope(sms):
            sliced_masked_gemm_signal(a, a_scale, b, b_scale, out, masked_m, expected_m,
                                      signal=signal, layout=layout,
                                      slice_experts=plan.slice_experts, streams=plan.streams)
    else:
        run_fused(a, a_scale, b, b_scale, out, masked_m, expected_m, signal=signal,
                  layout=layout, compute_num_sms=sms)
    return plan


def run_fused(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
              out: torch.Tensor, masked_m: torch.Tensor, expected_m: int, *,
              signal: torch.Tensor | None, layout: SboLayout, compute_num_sms: int) -> None:
    """The fused producer's launch as `signal_down_gemm` serves it (arguments as there):
    `fused_config` for `layout`'s tiles, the persistent grid capped at `compute_num_sms` SMs."""
    config = fused_config(layout, expected_m)
    grouped_gemm_fp8_signal(a, a_scale, b, b_scale, masked_m, out, config=config, signal=signal,
                            layout=layout, num_programs=config.programs(compute_num_sms))
