"""Hook on `sglang.srt.layers.deep_gemm_wrapper.entrypoint`: the SBO down GEMM is the plugin's
`kernels.down_gemm.signal_down_gemm` (fused or sliced, measured per shape), because no released
deep_gemm accepts the `enable_overlap` / `signal` kwargs SGLang's Hopper path passes."""

from __future__ import annotations

import logging
from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.planning.sbo_layout import SboLayout
from sglang_overlap.sglang.hooks import HookSpec

logger = logging.getLogger(__name__)

MASKED_GEMM = "sglang.srt.layers.deep_gemm_wrapper.entrypoint.grouped_gemm_nt_f8f8bf16_masked"


def masked_gemm(orig: Any, lhs: Any, rhs: Any, out: Any, masked_m: Any, expected_m: int,
                overlap_args: Any = None, max_block_n: int = 256, recipe_a: Any = None,
                recipe_b: Any = None) -> Any:
    layout: SboLayout | None = getattr(overlap_args, "sbo_layout", None)
    if overlap_args is None or layout is None:
        return orig(lhs, rhs, out, masked_m, expected_m, overlap_args=overlap_args,
                    max_block_n=max_block_n, recipe_a=recipe_a, recipe_b=recipe_b)
    from sglang_overlap.kernels import down_gemm
    from sglang_overlap.sglang.sbo_decision import note_signal_raised

    (a, a_scale), (b, b_scale) = lhs, rhs  # [E, C, K] fp8 + fp32 scales; [E, H, K] fp8 + scales
    plan = down_gemm.signal_down_gemm(a, a_scale, b, b_scale, out, masked_m, expected_m,
                                      signal=overlap_args.signal, layout=layout,
                                      compute_num_sms=overlap_args.num_sms)
    note_signal_raised(overlap_args.signal)  # launched: the combine send may now spin on it
    _note_producer(plan)
    if layout.granularity == "block":
        return layout.block_m, layout.expect_value
    return None  # per expert: the combine needs no block_m / threshold


_logged: set[str] = set()


def _note_producer(plan: Any) -> None:
    """Count the producer that ran (`stats` series sbo_producer_launches: the served producer
    is evidence, not a claim); log it the first time each producer runs in this process."""
    from sglang_overlap import stats

    path = str(getattr(plan, "path", "unknown"))
    stats.add("sbo_producer_launches", path)
    if path not in _logged:
        _logged.add(path)
        logger.info("sglang-overlap SBO down GEMM: producer %s ran (%s)", path,
                    getattr(plan, "why", ""))


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(MASKED_GEMM, masked_gemm, "around",
             "the SBO down GEMM is kernels.down_gemm (deep_gemm wheels lack the signal kwargs)",
             "src:66040fc1b260", feature=Feature.SBO),
)
