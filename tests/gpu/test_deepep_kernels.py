"""GPU: the installed DeepEP tree's low-latency dispatch (bf16, fp8) and combine against plain
torch, the plugin's combine overlap kwargs on the real `Buffer.low_latency_combine`, and normal
mode where the buffer can run it. One rank here; the same checks run under torchrun.

Rows of local expert e come in DeepEP's own order; `handle[0]` (src_info) names each row's source
token (hybrid-ep: int32 token; antgroup-opt: int64 token | rank << 32) and `handle[1]`
(layout_range [L, W] int64, low 32 bits = count, high 32 = first row) each source rank's rows.
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import HIDDEN, N_MAX
from tests.oracle import fp8 as oracle_fp8

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MAX_WORKERS = 1  # DeepEP's buffer (NVSHMEM) per process on one GPU: not run side by side yet

BF16_REL = 1e-2  # combine: bf16 outputs, fp32 accumulation of K weighted terms
FP8_REL = 5e-2  # e4m3 keeps 3 mantissa bits: <= 2^-4 per element, ~3e-2 in L2


def routing(kind: str, t: int, e: int, k: int, seed: int) -> torch.Tensor:
    """[T, K] int64 global expert ids (-1 = unrouted): random top-k / only the first half of
    the experts (the rest get no token) / every token on expert 0 alone."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "random":
        scores = torch.rand((t, e), generator=gen, device="cuda")
        return scores.topk(min(k, e), dim=-1).indices.long()
    if kind == "zero_experts":
        half = max(1, e // 2)
        idx = torch.rand((t, half), generator=gen, device="cuda").topk(min(k, half), -1).indices
        return torch.cat([idx, torch.full((t, k - idx.shape[1]), -1, device="cuda")], 1).long()
    if kind == "one_expert":
        idx = torch.full((t, k), -1, dtype=torch.long, device="cuda")
        idx[:, 0] = 0
        return idx
    raise ValueError(kind)


def rows_of(handle, local_e: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(source rank, source token) of every valid row of local expert `local_e`."""
    src_info, layout_range = handle[0][local_e], handle[1][local_e]  # [C], [W]
    ranks, tokens = [], []
    for r in range(world):
        packed = int(layout_range[r])
        count, first = packed & 0xFFFFFFFF, packed >> 32
        tok = src_info[first:first + count].long() & 0xFFFFFFFF
        ranks.append(torch.full_like(tok, r))
        tokens.append(tok)
    return torch.cat(ranks), torch.cat(tokens)


def _case(ep, e_local: int, t: int, kind: str, seed: int):
    e = e_local * ep.world
    x = torch.randn((t, HIDDEN), generator=torch.Generator(device="cuda").manual_seed(seed),
                    device="cuda").bfloat16()
    idx = routing(kind, t, e, 8, seed + ep.rank)
    w = torch.rand((t, 8), device="cuda")
    w = torch.where(idx >= 0, w, 0.0)
    return e, x, idx, w


SHAPES = [(8, 1), (8, 256), (16, 100), (32, 64), (32, 256)]
KINDS = ["random", "zero_experts", "one_expert"]


@pytest.mark.parametrize("use_fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("e_local,t", SHAPES)
def test_ll_dispatch_matches_torch(ep, e_local: int, t: int, kind: str, use_fp8: bool) -> None:
    from sglang_overlap.kernels import fp8

    e, x, idx, _w = _case(ep, e_local, t, kind, seed=e_local * 1000 + t)
    buf = ep.use(e)
    recv, count, handle, _ev, hook = buf.low_latency_dispatch(
        x, idx, N_MAX, e, use_fp8=use_fp8, async_finish=False, return_recv_hook=True)
    hook()
    torch.cuda.synchronize()
    xs, idxs = ep.gather(x), ep.gather(idx)
    for le in range(e_local):
        g = ep.rank * e_local + le
        want = sorted((r, int(tok)) for r in range(ep.world)
                      for tok in (idxs[r] == g).any(-1).nonzero().flatten().tolist())
        ranks, tokens = rows_of(handle, le, ep.world)
        got = sorted(zip(ranks.tolist(), tokens.tolist(), strict=True))
        assert int(count[le]) == len(want) and got == want, f"{e_local=} {t=} {kind=} {le=}"
        if not want:
            continue
        src = torch.stack([xs[r][tok] for r, tok in zip(ranks.tolist(), tokens.tolist(),
                                                         strict=True)])  # [n, H]
        n = len(want)
        if use_fp8:
            q, s = recv
            got_x = oracle_fp8.dequant_per_token_group(q[le, :n], s[le, :n], torch.float32)
            ours = oracle_fp8.dequant_per_token_group(*fp8.quant_per_token_group(src),
                                                      torch.float32)
            rel = float((got_x - src.float()).norm() / src.float().norm())
            rel_ours = float((got_x - ours).norm() / ours.norm())
            assert rel <= FP8_REL and rel_ours <= 1e-2, f"{e_local=} {t=} {kind=} {rel=}"
        else:
            assert torch.equal(recv[le, :n], src), f"{e_local=} {t=} {kind=} {le=}"


def _expert_out(recv_bf16: torch.Tensor, ep, e_local: int) -> torch.Tensor:
    """Unweighted expert outputs: row of local expert e scaled by (1 + global id) / 8."""
    g = torch.arange(e_local, device="cuda") + ep.rank * e_local
    return (recv_bf16.float() * ((1 + g) / 8.0)[:, None, None]).bfloat16()


def _combine_ref(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    scale = torch.where(idx >= 0, (1 + idx).float() / 8.0, 0.0)  # [T, K]
    return x.float() * (w * scale).sum(-1, keepdim=True)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    b = b.float()
    return float((a.float() - b).norm() / b.norm().clamp(min=1e-30))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("e_local,t", SHAPES)
def test_ll_combine_matches_torch(ep, e_local: int, t: int, kind: str) -> None:
    e, x, idx, w = _case(ep, e_local, t, kind, seed=7 + t)
    buf = ep.use(e)
    recv, _count, handle, _ev, hook = buf.low_latency_dispatch(
        x, idx, N_MAX, e, use_fp8=False, async_finish=False, return_recv_hook=True)
    hook()
    out, _ev, chook = buf.low_latency_combine(_expert_out(recv, ep, e_local), idx, w, handle,
                                              async_finish=False, return_recv_hook=True)
    chook()
    rel = _rel(out, _combine_ref(x, idx, w))
    assert rel <= BF16_REL, f"{e_local=} {t=} {kind=} {rel=}"


@pytest.mark.parametrize("e_local,t", [(8, 128), (32, 256)])
def test_plugin_overlap_kwargs_bind_and_run_on_real_combine(ep, e_local: int, t: int) -> None:
    """The kwargs the plugin builds for this tree's form bind to its real low_latency_combine
    and, with the signal at its final value, give the plain combine's result; the other
    form's kwargs are refused at start-up (ValueError) and by the real call (TypeError)."""
    from sglang_overlap.kernels.capabilities import device_num_sms as num_sms
    from sglang_overlap.kernels.combine_overlap import check_combine_call, layout_overlap_kwargs
    from sglang_overlap.kernels.down_gemm import combine_signal_layout
    from sglang_overlap.kernels.package_source import read_params
    from sglang_overlap.kernels.signals import new_signal

    if ep.form is None:
        pytest.skip("this deep_ep takes no combine overlap form")
    e, x, idx, w = _case(ep, e_local, t, "random", seed=3)
    buf = ep.use(e)
    params = read_params("deep_ep", "Buffer.low_latency_combine")
    assert params is not None, "deep_ep.Buffer.low_latency_combine not found"
    results = []
    for form in ("per_expert", "per_block"):
        recv, count, handle, _ev, hook = buf.low_latency_dispatch(
            x, idx, N_MAX, e, use_fp8=False, async_finish=False, return_recv_hook=True)
        hook()
        lay = combine_signal_layout(form, num_local_experts=e_local, world_size=ep.world,
                                    num_max_dispatch_tokens_per_rank=N_MAX, num_tokens=t,
                                    hidden=HIDDEN, expected_m=t, num_sms=num_sms(),
                                    comm_num_sms=3)
        sig = new_signal(lay, "cuda")
        sig.view(torch.int32).fill_(lay.expect_value)
        kwargs = layout_overlap_kwargs(form, lay, sig, count, num_sms=lay.comm_num_sms)
        y = _expert_out(recv, ep, e_local)
        if form != ep.form:
            with pytest.raises(ValueError, match="does not accept"):
                check_combine_call(params, kwargs)
            with pytest.raises(TypeError):
                buf.low_latency_combine(y, idx, w, handle, async_finish=False,
                                        return_recv_hook=True, **kwargs)
            out, _ev, chook = buf.low_latency_combine(y, idx, w, handle, async_finish=False,
                                                      return_recv_hook=True)
            chook()  # keep DeepEP's buffer parity: one combine per dispatch
            continue
        check_combine_call(params, kwargs)
        out, _ev, chook = buf.low_latency_combine(y, idx, w, handle, async_finish=False,
                                                  return_recv_hook=True, **kwargs)
        chook()
        results.append(out)
    torch.cuda.synchronize()
    rel = _rel(results[0], _combine_ref(x, idx, w))
    assert rel <= BF16_REL, f"{ep.form=} {rel=}"


def test_normal_mode_dispatch_combine(ep) -> None:
    """Normal (intranode) mode through the plugin's HarnessDeepEPDispatcher, on >= 2 ranks."""
    if ep.world == 1:
        pytest.skip("DeepEP's normal (intranode) kernels are compiled for 2, 4 or 8 ranks only "
                    "(SWITCH_RANKS in csrc/kernels/launch.cuh): a one-rank buffer cannot run "
                    "them; run under torchrun --nproc-per-node 2+")
    from benchmarks.harness.deepep import HarnessDeepEPDispatcher, plan_deepep_buffer
    from sglang_overlap.kernels.contracts import NormalDispatchOutput

    e_local, t = 8, 64
    e, x, idx, w = _case(ep, e_local, t, "random", seed=11)
    plan = plan_deepep_buffer(hidden=HIDDEN, num_experts=e, world_size=ep.world,
                              max_batch_per_rank=t, layouts=("normal",))
    disp = HarnessDeepEPDispatcher.create(ep.group, plan)
    pending = disp.dispatch_send(x, idx, w, layout="normal", slot=0)
    got = disp.dispatch_recv(pending)
    assert isinstance(got, NormalDispatchOutput), type(got)
    g = (got.row_expert.long() + ep.rank * e_local)  # [R] global ids, < rank*L for padding
    scale = torch.where(got.row_expert >= 0, (1 + g).float() / 8.0, 0.0)
    out = (got.hidden.float() * scale[:, None]).bfloat16()
    combined = disp.combine_recv(disp.combine_send(out, got))
    rel = _rel(combined, _combine_ref(x, idx, w))
    assert rel <= BF16_REL, f"{rel=}"
