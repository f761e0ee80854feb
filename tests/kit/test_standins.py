"""The CPU kit's stand-ins (tests/kit/standins, cpu_shim/sglang_cpu_shim/deep_ep_gloo.py):
they declare the real trees' signatures (tests/fixtures), the plugin's capability probe reads the
same overlap form from them as from the real tree, and they compute DeepEP's and DeepGEMM's
contracts: low-latency and normal dispatch/combine on gloo over two processes, the overlap
signals checked, the masked fp8 GEMM equal to the dequantized product."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_overlap.kernels.capabilities import probe
from sglang_overlap.kernels.package_source import FunctionParams, read_params

KIT = Path(__file__).resolve().parent
STANDINS = KIT / "standins"
SHIM = KIT / "cpu_shim"
FIXTURES = KIT.parent / "fixtures"
TREES = {"per_expert": FIXTURES / "deep_ep_trees" / "sgl-deep-ep-0.1.2.post1",
         "per_block": FIXTURES / "deep_ep_trees" / "antgroup-opt-76f0271"}
DEEP_GEMM_TREE = FIXTURES / "deep_gemm_trees" / "sgl-deep-gemm-0.2.3.post2"


def _params(module: str, qualname: str, folder: Path) -> FunctionParams:
    found = read_params(module, qualname, search_path=[str(folder)])
    assert found is not None, (module, qualname, folder)
    return dataclasses.replace(found, where="")


@pytest.mark.parametrize("form", sorted(TREES))
@pytest.mark.parametrize("method", ["low_latency_dispatch", "low_latency_combine",
                                    "get_dispatch_config", "get_combine_config",
                                    "get_dispatch_layout", "dispatch", "combine"])
def test_deep_ep_stand_in_declares_the_trees_signature(form: str, method: str) -> None:
    standin = STANDINS / f"deep_ep_{form}"
    assert _params("deep_ep", f"Buffer.{method}", standin) == _params(
        "deep_ep", f"Buffer.{method}", TREES[form])


@pytest.mark.parametrize("name", ["fp8_m_grouped_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked",
                                  "m_grouped_bf16_gemm_nt_masked",
                                  "m_grouped_fp8_gemm_nt_contiguous",
                                  "m_grouped_bf16_gemm_nt_contiguous"])
def test_deep_gemm_stand_in_declares_the_wheels_signature(name: str) -> None:
    assert _params("deep_gemm", name, STANDINS / "deep_gemm") == _params(
        "deep_gemm", name, DEEP_GEMM_TREE)


@pytest.mark.parametrize("form", sorted(TREES))
def test_the_plugins_probe_reads_the_same_form(form: str) -> None:
    standin = probe(search_path=[str(STANDINS / f"deep_ep_{form}"), str(STANDINS / "deep_gemm")],
                    assume_arch="sm90")
    real = probe(search_path=[str(TREES[form]), str(DEEP_GEMM_TREE)], assume_arch="sm90")
    assert standin.capabilities.deep_ep_combine_forms == (form,)
    assert standin.capabilities == real.capabilities


def _import_standins(form: str) -> None:
    for path in (str(SHIM), str(STANDINS / f"deep_ep_{form}"), str(STANDINS / "deep_gemm")):
        if path not in sys.path:
            sys.path.insert(0, path)
    for name in [m for m in sys.modules if m.split(".")[0] in ("deep_ep", "deep_gemm")]:
        del sys.modules[name]


# Two ranks: T_r tokens each (different), K = 2, E = 4 experts (2 per rank), H = 128.
TOKENS, K, E, H, N = (3, 2), 2, 4, 128, 4


def _inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    t = TOKENS[rank]
    x = torch.randn(t, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(t)])
    ids[0, 1] = -1  # one unrouted slot
    w = torch.rand(t, K, generator=g)
    return x, ids, w


def _worker(rank: int, port: int, form: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    _import_standins(form)
    import deep_ep
    from sglang_cpu_shim.deep_ep_gloo import SignalNotRaised

    buf = deep_ep.Buffer(dist.group.WORLD, 0, 1 << 20, low_latency_mode=True)
    x, ids, w = _inputs(rank)
    recv, count, handle, event, hook = buf.low_latency_dispatch(
        x, ids, N, E, use_fp8=False, return_recv_hook=True)
    hook()
    e_local = E // 2
    for e in range(e_local):  # rows of each sender's tokens routed to global expert g, in order
        g = rank * e_local + e
        want = [xs[t] for xs, ids_s, _ in map(_inputs, (0, 1))
                for t in range(ids_s.shape[0]) if (ids_s[t] == g).any()]
        assert int(count[e]) == len(want)
        if want:
            assert torch.equal(recv[e, : len(want)], torch.stack(want))
        assert not recv[e, len(want):].any()
    out = recv * torch.arange(1, e_local + 1, dtype=recv.dtype)[:, None, None]  # expert e: *(e+1)
    combined, _, hook = buf.low_latency_combine(out, ids, w, handle, return_recv_hook=True)
    hook()
    scale = torch.where(ids >= 0, ids % e_local + 1, 0).float()
    ref = torch.zeros(x.shape[0], H)
    for j in range(K):
        ref = ref + torch.where((ids[:, j] >= 0)[:, None], (w[:, j] * scale[:, j])[:, None] * x,
                                0.0)
    torch.testing.assert_close(combined, ref, rtol=1e-6, atol=1e-6)

    q, sf = buf.low_latency_dispatch(x, ids, N, E, use_fp8=True)[0]
    assert q.dtype == torch.float8_e4m3fn and sf.shape == (e_local, 2 * N, H // 128)
    torch.testing.assert_close(q.float() * sf.repeat_interleave(128, -1), recv, rtol=0.07,
                               atol=1e-3)

    # overlap: the signals must cover every valid row; a missing one is an error
    handle = buf.low_latency_dispatch(x, ids, N, E, use_fp8=False)[2]
    raised, missing = _signals(form, count, full=True), _signals(form, count, full=False)
    buf.low_latency_combine(out, ids, w, handle, overlap=True, **raised)
    if count.max() > 0:
        with pytest.raises(SignalNotRaised):
            buf.low_latency_combine(out, ids, w, handle, overlap=True, **missing)
        buf.low_latency_combine(out, ids, w, handle)  # keep the ranks' collectives paired
    dist.destroy_process_group()


def _signals(form: str, count: torch.Tensor, full: bool) -> dict[str, object]:
    e_local = count.numel()
    if form == "per_expert":
        sig = torch.full((e_local,), 3, dtype=torch.int32)
        if not full:
            sig[int(count.argmax())] = 2
        return {"src_signals": sig, "src_signal_expect_value": 3}
    block_m, blocks = 2, -(-2 * N // 2)
    sig = torch.full((e_local * blocks,), 5, dtype=torch.int32)
    if not full:
        e = int(count.argmax())
        sig[e * blocks + (int(count[e]) - 1) // block_m] = 4  # the last used block
    return {"packed_recv_count": count.clone(), "comp_signal": sig, "block_m": block_m,
            "threshold": 5, "num_sms": 3}


@pytest.mark.parametrize("form", sorted(TREES))
def test_low_latency_dispatch_and_combine_on_gloo(form: str, unused_tcp_port: int) -> None:
    mp.spawn(_worker, args=(unused_tcp_port, form), nprocs=2, join=True)


def _normal_inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, ids, w = _inputs(rank)
    if rank == 1:
        ids[-1] = -1  # a token routed nowhere
    return x, ids, w


def _normal_worker(rank: int, port: int, form: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    _import_standins(form)
    import deep_ep
    from sglang_cpu_shim.deep_ep_gloo import COUNTERS, quantize_fp8

    buf = deep_ep.Buffer(dist.group.WORLD, 1 << 20, 0)
    x, ids, w = _normal_inputs(rank)
    e_local, align = E // 2, 4
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(ids, E)
    owner = torch.where(ids >= 0, ids // e_local, -1)
    assert torch.equal(in_rank, torch.stack([(owner == r).any(-1) for r in (0, 1)], 1))
    assert per_rdma is None and per_rank.tolist() == in_rank.sum(0).tolist()
    assert per_expert.tolist() == [int((ids == g).sum()) for g in range(E)]
    layout = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                  num_tokens_per_expert=per_expert, topk_idx=ids, topk_weights=w)
    recv_x, recv_ids, recv_w, counts, handle, _ = buf.dispatch(
        x, expert_alignment=align, config=deep_ep.Buffer.get_dispatch_config(2), **layout)
    # every token with an expert here, in source-rank then token order; local ids, -1 / 0 else
    want = [(xs[t], ids_s[t], w_s[t]) for xs, ids_s, w_s in map(_normal_inputs, (0, 1))
            for t in range(ids_s.shape[0])
            if ((ids_s[t] >= 0) & (ids_s[t] // e_local == rank)).any()]
    assert recv_x.shape[0] == len(want) == recv_ids.shape[0] == recv_w.shape[0]
    for r, (xt, it, wt) in enumerate(want):
        local = (it >= 0) & (it // e_local == rank)
        assert torch.equal(recv_x[r], xt)
        assert recv_ids[r].tolist() == torch.where(local, it - rank * e_local, -1).tolist()
        assert torch.equal(recv_w[r], torch.where(local, wt, 0.0))
    assert counts == [-(-int((recv_ids == e).any(-1).sum()) // align) * align
                      for e in range(e_local)]
    # combine sums each received row's output back to its token, over the ranks it went to
    out = recv_x * (rank + 1)
    combined, weights, _ = buf.combine(out, handle, topk_weights=recv_w,
                                       config=deep_ep.Buffer.get_combine_config(2))
    ref = sum(in_rank[:, r, None] * (r + 1) * x for r in (0, 1))
    torch.testing.assert_close(combined, ref, rtol=0, atol=0)
    assert torch.equal(weights, torch.where(ids >= 0, w, 0.0))
    if rank == 1:
        assert not combined[-1].any()
    q, sf = quantize_fp8(x)  # an fp8 dispatch moves the pair as it is
    (recv_q, recv_sf), *_ = buf.dispatch((q, sf), **layout)
    want_q, want_sf = quantize_fp8(recv_x)  # per-row quantization: the senders' rows
    assert recv_q.dtype == torch.float8_e4m3fn
    assert torch.equal(recv_q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(recv_sf, want_sf)
    assert (COUNTERS["normal_dispatch"], COUNTERS["normal_combine"]) == (2, 1)
    with pytest.raises(ValueError):  # a layout not of these topk_idx
        buf.dispatch(x, **{**layout, "is_token_in_rank": ~in_rank})
    dist.destroy_process_group()


@pytest.mark.parametrize("form", sorted(TREES))
def test_normal_dispatch_and_combine_on_gloo(form: str, unused_tcp_port: int) -> None:
    mp.spawn(_normal_worker, args=(unused_tcp_port, form), nprocs=2, join=True)


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def standin_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-ins importable in this process for one test; sys.path and the deep_ep /
    deep_gemm modules (the installed ones, for the other tests) restored after."""
    for path in (SHIM, STANDINS / "deep_ep_per_expert", STANDINS / "deep_gemm"):
        monkeypatch.syspath_prepend(str(path))
    for name in [m for m in sys.modules if m.split(".")[0] in ("deep_ep", "deep_gemm")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ("deep_ep", "deep_gemm")]:
        del sys.modules[name]


def test_masked_fp8_gemm_is_the_dequantized_product(standin_modules: None) -> None:
    import deep_gemm
    from sglang_cpu_shim.deep_ep_gloo import quantize_fp8

    g = torch.Generator().manual_seed(7)
    groups, m, n, k = 3, 5, 256, 256
    a, sfa = quantize_fp8(torch.randn(groups, m, k, generator=g))
    b = torch.randn(groups, n, k, generator=g).to(torch.float8_e4m3fn)
    sfb = torch.rand(groups, n // 128, k // 128, generator=g) + 0.5
    d = torch.full((groups, m, n), 7.0)
    masked_m = torch.tensor([5, 0, 2], dtype=torch.int32)
    deep_gemm.fp8_m_grouped_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, 4)
    a_deq = a.float() * sfa.repeat_interleave(128, -1)
    b_deq = b.float() * sfb.repeat_interleave(128, 1).repeat_interleave(128, 2)
    for e, rows in enumerate(masked_m.tolist()):
        assert torch.equal(d[e, :rows], a_deq[e, :rows] @ b_deq[e].T)
        assert (d[e, rows:] == 7.0).all()  # rows past masked_m untouched
    with pytest.raises(TypeError):  # like the wheel: no signal arguments
        deep_gemm.fp8_m_grouped_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, 4,
                                               enable_overlap=True, signal=None)
