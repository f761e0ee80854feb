"""DeepGEMM backend: fp8 grouped expert GEMMs for both DeepEP layouts (plain launches).

The only module that imports `deep_gemm`, lazily (the kernels import on CPU without it). The API is
detected by signature, not version string:
- "grouped" (sgl-deep-gemm 0.1.4.post1 and 0.2.x): `m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m,
  expected_m, recipe=...)` / `m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout)`, operands
  as (data, scale) pairs; activation scales may be plain fp32 (DeepGEMM re-lays them out) or
  already MN-major TMA-aligned (what `fp8.silu_and_mul_quant` writes).
- "legacy" (DeepGEMM 1.x): `m_grouped_gemm_fp8_fp8_bf16_nt_masked` / `..._nt_contiguous`, whose
  activation scales must be MN-major TMA-aligned.
No released wheel accepts `enable_overlap`/`signal` on Hopper; the signal producers are
`signal_deepgemm/`, `signal_fused.py` and `signal_sliced.py` (one per `SignalPlan.path`).

Legend: E local experts, M capacity rows per expert, T rows of the contiguous layout, H hidden,
I intermediate, K reduction dim, N output dim.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from sglang_overlap.compat import SGLANG_DEEP_GEMM, SUPPORTED_SGLANG
from sglang_overlap.kernels import fp8

if TYPE_CHECKING:
    pass

INSTALL_HINT = (f"install sgl-deep-gemm (0.1.4.post1 for torch 2.11, or {SGLANG_DEEP_GEMM} as "
                f"sglang {SUPPORTED_SGLANG} pins) on a Hopper GPU")


@dataclass(frozen=True)
class DeepGemmApi:
    """What the installed deep_gemm offers, found by signature."""

    flavour: Literal["grouped", "legacy"]
    version: str
    masked: Any
    contiguous: Any
    mk_alignment: int
    native_signal: bool
    """True only for a fork whose masked GEMM takes `enable_overlap`/`signal` (none released)."""
    module: Any


_API: DeepGemmApi | None = None


def _params(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def detect_api(module: Any) -> DeepGemmApi:
    """Classify an imported deep_gemm module; raise naming the version and what to install."""
    version = str(getattr(module, "__version__", "unknown"))
    for name in ("m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
                 "m_grouped_fp8_fp4_gemm_nt_masked"):
        masked = getattr(module, name, None)
        if masked is not None and {"masked_m", "expected_m"} <= _params(masked):
            contiguous = getattr(module, "m_grouped_fp8_gemm_nt_contiguous", None) or getattr(
                module, "m_grouped_fp8_fp4_gemm_nt_contiguous", None)
            if contiguous is None:
                break
            align_fn = module.get_mk_alignment_for_contiguous_layout
            return DeepGemmApi("grouped", version, masked, contiguous, int(align_fn()),
                               "signal" in _params(masked), module)
    masked = getattr(module, "m_grouped_gemm_fp8_fp8_bf16_nt_masked", None)
    contiguous = getattr(module, "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", None)
    if masked is not None and contiguous is not None:
        align_fn = module.get_m_alignment_for_contiguous_layout
        return DeepGemmApi("legacy", version, masked, contiguous, int(align_fn()), False, module)
    raise RuntimeError(f"deep_gemm {version} has neither m_grouped_fp8_gemm_nt_masked(a, b, d, "
                       f"masked_m, expected_m) nor m_grouped_gemm_fp8_fp8_bf16_nt_masked; "
                       f"{INSTALL_HINT}")


def api() -> DeepGemmApi:
    """The installed DeepGEMM's API (imported on first use)."""
    global _API
    if _API is None:
        try:
            import deep_gemm
        except ImportError as exc:
            raise RuntimeError(f"the DeepGEMM expert runner needs deep_gemm: {INSTALL_HINT} "
                               f"({exc})") from exc
        _API = detect_api(deep_gemm)
    return _API


@contextlib.contextmanager
def num_sms_scope(sms: int | None) -> Iterator[None]:
    """Run DeepGEMM launches inside on `sms` SMs (None: leave it), restoring the old count."""
    if sms is None:
        yield
        return
    mod = api().module
    old = mod.get_num_sms()
    mod.set_num_sms(sms)
    try:
        yield
    finally:
        mod.set_num_sms(old)


def _legacy_scale(s: torch.Tensor) -> torch.Tensor:
    rows = s.shape[-2]
    if s.stride(-2) == 1 and s.stride(-1) == fp8.tma_aligned_rows(rows):
        return s
    out = fp8.empty_mn_major_scales(tuple(s.shape[:-2]), rows, s.shape[-1], s.device)
    out.copy_(s)
    return out


def masked_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                out: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> None:
    """out[e, :masked_m[e]] = a[e] @ b[e]^T, fp8 block-scaled (the LL layout's grouped GEMM).

    a `[E, M, K]` fp8, a_scale `[E, M, K/128]` fp32; b `[E, N, K]` fp8, b_scale
    `[E, N/128, K/128]` fp32; out `[E, M, N]` bf16; masked_m `[E]` int32; expected_m a hint.
    """
    if a.shape[1] % 64:
        # sgl-deep-gemm 0.1.4.post1 writes wrong rows at capacity 16 or 32
        raise ValueError(f"DeepGEMM's masked GEMM needs a capacity M that is a multiple of 64 "
                         f"(got M={a.shape[1]}); pad the per-expert buffer")
    dg = api()
    if dg.flavour == "grouped":
        dg.masked((a, a_scale), (b, b_scale), out, masked_m, expected_m)
    else:
        dg.masked((a, _legacy_scale(a_scale)), (b, b_scale), out, masked_m, expected_m)


def contiguous_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                    b_scale: torch.Tensor, out: torch.Tensor, m_indices: torch.Tensor) -> None:
    """out[t] = a[t] @ b[m_indices[t]]^T for the normal layout; rows with m_indices -1 are padding.

    a `[T, K]` fp8, a_scale `[T, K/128]` fp32; m_indices `[T]` int32, each expert's rows
    contiguous and aligned to `api().mk_alignment`; out `[T, N]` bf16.
    """
    dg = api()
    if a.shape[0] == 0:
        return
    scale = a_scale if dg.flavour == "grouped" else _legacy_scale(a_scale)
    dg.contiguous((a, scale), (b, b_scale), out, m_indices)


@dataclass(frozen=True)
class Fp8ExpertWeights:
    """One layer's local experts, fp8 with 128x128 block scales."""

    w13: torch.Tensor  # [E, 2I, H] fp8: gate rows then up rows
    w13_scale: torch.Tensor  # [E, 2I/128, H/128] fp32
    w2: torch.Tensor  # [E, H, I] fp8
    w2_scale: torch.Tensor  # [E, H/128, I/128] fp32

    @classmethod
    def quantize(cls, w13: torch.Tensor, w2: torch.Tensor) -> Fp8ExpertWeights:
        """From float `[E, 2I, H]` and `[E, H, I]` weights."""
        q13, s13 = fp8.quant_per_block(w13)
        q2, s2 = fp8.quant_per_block(w2)
        return cls(q13, s13, q2, s2)


def run_masked_experts(x: torch.Tensor, x_scale: torch.Tensor, masked_m: torch.Tensor,
                       expected_m: int, weights: Fp8ExpertWeights, *,
                       down: Any = None) -> torch.Tensor:
    """LL layout: up GEMM, SiLU-and-mul + fp8 quant, down GEMM. x `[E, M, H]` fp8,
    x_scale `[E, M, H/128]` fp32, masked_m `[E]` int32 -> `[E, M, H]` bf16 (rows past masked_m
    undefined). `down(a, a_scale, b, b_scale, out)` replaces the plain down GEMM (e.g. a
    signal-emitting one)."""
    e, m_cap, _ = x.shape
    inter2, hidden = weights.w13.shape[1], weights.w2.shape[1]
    up = torch.empty((e, m_cap, inter2), dtype=torch.bfloat16, device=x.device)
    masked_gemm(x, x_scale, weights.w13, weights.w13_scale, up, masked_m, expected_m)
    act, act_scale = fp8.silu_and_mul_quant(up, masked_m)
    out = torch.empty((e, m_cap, hidden), dtype=torch.bfloat16, device=x.device)
    if down is None:
        masked_gemm(act, act_scale, weights.w2, weights.w2_scale, out, masked_m, expected_m)
    else:
        down(act, act_scale, weights.w2, weights.w2_scale, out)
    return out


def run_contiguous_experts(x: torch.Tensor, x_scale: torch.Tensor, m_indices: torch.Tensor,
                           weights: Fp8ExpertWeights) -> torch.Tensor:
    """Normal layout: x `[T, H]` fp8, x_scale `[T, H/128]` fp32, m_indices `[T]` int32 (-1 pads)
    -> `[T, H]` bf16 (padding rows undefined)."""
    t = x.shape[0]
    inter2, hidden = weights.w13.shape[1], weights.w2.shape[1]
    up = torch.empty((t, inter2), dtype=torch.bfloat16, device=x.device)
    contiguous_gemm(x, x_scale, weights.w13, weights.w13_scale, up, m_indices)
    act, act_scale = fp8.silu_and_mul_quant(up)
    out = torch.empty((t, hidden), dtype=torch.bfloat16, device=x.device)
    contiguous_gemm(act, act_scale, weights.w2, weights.w2_scale, out, m_indices)
    return out
