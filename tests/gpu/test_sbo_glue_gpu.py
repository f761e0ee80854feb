"""GPU: the SBO glue's down-GEMM route (upstream/deep_gemm_wrapper_entrypoint.py) on the
plugin's signal GEMM.

What SGLang's `DeepGemmRunnerCore._run_masked_gemm` would hand `grouped_gemm_nt_f8f8bf16_masked`
on Hopper once `compute_overlap_args` has run through the plugin: fp8 operands with fp32 block
scales (activation scales MN-major, as DeepGEMM wants them) and DownGemmOverlapArgs carrying the
plugin's layout. Checks the output against fp64, that every counter reached its final value, and
the (block_m, threshold) returned for the per-block form. Needs no sglang (stand-ins for
upstream's two overlap-args dataclasses, same fields) and no deep_gemm.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from sglang_overlap.planning.sbo_layout import Granularity
from tests.oracle import fp8 as oracle_fp8

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
FP8_TOL = 1e-3  # DeepGEMM's calc_diff bound for fp8 GEMMs


def _calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denom = float((x * x + y * y).sum())
    return 0.0 if denom == 0 else 1.0 - 2.0 * float((x * y).sum()) / denom


@pytest.mark.gpu_mem(6)  # the fp64 reference at E 8: 4.4 GiB reserved on an H100 (2026-12-07)
@pytest.mark.parametrize("granularity", ["expert", "block"])
@pytest.mark.parametrize("e, m_cap, expected_m", [(8, 128, 16), (4, 256, 200)])
def test_glue_masked_gemm_route(granularity: Granularity, e: int, m_cap: int,
                                expected_m: int) -> None:
    pytest.importorskip("triton")
    from sglang_overlap.kernels import fp8
    from sglang_overlap.planning.sbo_path import SboDecision, SboPath
    from sglang_overlap.sglang.upstream.deep_gemm_wrapper_entrypoint import masked_gemm
    from sglang_overlap.sglang.upstream.single_batch_overlap import apply_plugin_signal

    n, k = 7168, 2048  # DeepSeek-V3 down projection
    gen = torch.Generator(device="cuda").manual_seed(e * 1000 + m_cap)
    x = torch.randn((e, m_cap, k), generator=gen, device="cuda", dtype=torch.bfloat16)
    w = torch.randn((e, n, k), generator=gen, device="cuda") / math.sqrt(k)
    a, a_s = fp8.quant_per_token_group(x)
    b, b_s = fp8.quant_per_block(w)
    masked = torch.randint(0, m_cap + 1, (e,), generator=gen, device="cuda", dtype=torch.int32)
    masked[0] = 0  # an expert with no tokens must still reach its final counter value

    decision = SboDecision(SboPath.PER_EXPERT if granularity == "expert" else
                           SboPath.FINE_GRAINED, "gpu test", granularity=granularity,
                           gemm_signal_source="plugin")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    combine = SimpleNamespace(overlap=True, num_sms=3, signal=None, threshold=0)
    down = SimpleNamespace(num_sms=sms - 3, signal=None, start_event=None)
    meta = {"compute_num_sms": sms - 3}
    apply_plugin_signal(decision, combine, down, meta, (e, m_cap, n), expected_m, "cuda")
    out = torch.full((e, m_cap, n), float("nan"), device="cuda", dtype=torch.bfloat16)

    def no_deep_gemm(*args: object, **kwargs: object) -> None:
        raise AssertionError("the plugin route must not call deep_gemm")

    ret = masked_gemm(no_deep_gemm, (a, a_s), (b, b_s), out, masked, expected_m,
                           overlap_args=down)
    torch.cuda.synchronize()
    lay = down.sbo_layout
    want = torch.bmm(oracle_fp8.dequant_per_token_group(a, a_s),
                     oracle_fp8.dequant_per_block(b, b_s).transpose(1, 2))
    rows = torch.arange(m_cap, device="cuda")[None, :] < masked[:, None].long()  # [E, M]
    diff = _calc_diff(out[rows], want[rows])
    assert diff < FP8_TOL, f"{granularity=} {e=} {m_cap=} {diff=}"
    counters = combine.signal.view(torch.int32)
    assert bool((counters == lay.expect_value).all()), f"{counters.tolist()=} {lay.expect_value=}"
    if granularity == "block":
        assert ret == (lay.block_m, lay.expect_value) == (meta["block_m"], meta["threshold"])
    else:
        assert ret is None and combine.threshold == lay.expect_value
