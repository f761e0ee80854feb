"""The DeepEP backend on CPU: buffer sizing, the combine call in every probed form, and the
dispatcher's plumbing against a one-rank stand-in whose every call is bound to the parameters
the installed sgl-deep-ep declares (deep_ep cannot load without a CUDA device)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.harness.deepep import HarnessDeepEPDispatcher, plan_deepep_buffer
from sglang_overlap.kernels.combine_overlap import check_combine_call, combine_overlap_kwargs
from sglang_overlap.kernels.package_source import FunctionParams, package_dir, read_params
from sglang_overlap.kernels.signals import SignalContract
from sglang_overlap.planning.sbo_layout import plan_sbo_layout
from tests.oracle.experts import LocalDispatcher, ReferenceExperts

INSTALLED = package_dir("deep_ep") is not None
needs_deep_ep = pytest.mark.skipif(not INSTALLED, reason="sgl-deep-ep not installed")
PER_BLOCK_SRC = '''
class Buffer:
    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False,
                            out=None, overlap=False, packed_recv_count=None, comp_signal=None,
                            block_m=64, threshold=0, num_sms=3):
        pass
'''
NO_OVERLAP_SRC = '''
class Buffer:
    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False, out=None):
        pass
'''


def _fake_deep_ep(tmp_path: Path, src: str) -> FunctionParams:
    pkg = tmp_path / "deep_ep"
    (pkg / "buffers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .buffers.legacy import Buffer\n")
    (pkg / "buffers" / "__init__.py").write_text("")
    (pkg / "buffers" / "legacy.py").write_text(src)
    params = read_params("deep_ep", "Buffer.low_latency_combine", [str(tmp_path)])
    assert params is not None
    return params


def test_plan_decode_buffer() -> None:
    plan = plan_deepep_buffer(hidden=7168, num_experts=256, world_size=8, max_batch_per_rank=64,
                              tokens_per_seq=2)
    assert (plan.num_max_dispatch_tokens_per_rank, plan.capacity, plan.num_local_experts) == (
        128, 1024, 32)
    assert plan.num_qps_per_rank == 32 and plan.nvshmem_qp_depth == 1024
    ll = plan_deepep_buffer(hidden=7168, num_experts=256, world_size=8, max_batch_per_rank=1000,
                            layouts=("low_latency",))
    assert ll.nvshmem_qp_depth == 2002 and ll.num_qps_per_rank == 32
    normal = plan_deepep_buffer(hidden=7168, num_experts=16, world_size=8, max_batch_per_rank=8,
                                layouts=("normal",), normal_num_sms=24)
    assert normal.num_qps_per_rank == 24


@pytest.mark.parametrize("kw, needle", [
    (dict(num_experts=10, world_size=4), "num_experts=10"),
    (dict(max_batch_per_rank=600, tokens_per_seq=2), "SGLANG_DEEPEP_NUM_MAX_DISPATCH"),
    (dict(hidden=0), "hidden must be >= 1"),
    (dict(layouts=("fast",)), "layouts"),
])
def test_plan_refuses_impossible(kw: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = dict(hidden=1024, num_experts=16, world_size=4, max_batch_per_rank=8)
    with pytest.raises(ValueError, match=needle):
        plan_deepep_buffer(**(args | kw))


# --- the combine call against each form's declared parameters -------------------------------

def _kwargs(form: str | None) -> dict[str, Any]:
    sig = torch.zeros(4, dtype=torch.int32)
    return combine_overlap_kwargs(form, signal=None if form is None else sig,  # type: ignore
                                  expect_value=7, packed_recv_count=sig, block_m=64,
                                  threshold=7, num_sms=3)


@needs_deep_ep
def test_installed_deep_ep_takes_per_expert_and_not_hoppers_per_block() -> None:
    params = read_params("deep_ep", "Buffer.low_latency_combine")
    assert params is not None and "legacy.py" in params.where
    check_combine_call(params, _kwargs("per_expert"))
    check_combine_call(params, _kwargs(None))
    # what SGLang 0.5.23 passes on SM90: the TypeError it would raise mid-serving
    with pytest.raises(ValueError, match="comp_signal|packed_recv_count"):
        check_combine_call(params, _kwargs("per_block"))


@pytest.mark.parametrize("src, ok, bad", [
    (PER_BLOCK_SRC, ("per_block", None), ("per_expert",)),
    (NO_OVERLAP_SRC, (None,), ("per_expert", "per_block")),
])
def test_fake_trees_bind_only_their_form(tmp_path: Path, src: str, ok: tuple[Any, ...],
                                         bad: tuple[str, ...]) -> None:
    params = _fake_deep_ep(tmp_path, src)
    for form in ok:
        check_combine_call(params, _kwargs(form))
    for form in bad:
        with pytest.raises(ValueError, match="does not accept"):
            check_combine_call(params, _kwargs(form))


def test_signal_without_form_is_refused() -> None:
    with pytest.raises(ValueError, match="no combine overlap form"):
        combine_overlap_kwargs(None, signal=torch.zeros(2))
    with pytest.raises(ValueError, match="block_m"):
        combine_overlap_kwargs("per_block", signal=torch.zeros(2), packed_recv_count=None)


# --- the dispatcher over a one-rank stand-in bound to the installed signatures --------------

class _Event:
    def current_stream_wait(self) -> None:
        pass


class LoopbackBuffer:
    """DeepEP `Buffer` semantics for one rank, every call bound to the installed signature."""

    group_size = 1

    def __init__(self) -> None:
        names = ("low_latency_dispatch", "low_latency_combine", "get_dispatch_layout",
                 "dispatch", "combine")
        self.sigs = {}
        for n in names:
            p = read_params("deep_ep", f"Buffer.{n}")
            assert p is not None, n
            self.sigs[n] = p.signature()
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _bind(self, name: str, *a: Any, **k: Any) -> dict[str, Any]:
        bound: inspect.BoundArguments = self.sigs[name].bind(self, *a, **k)
        self.calls.append((name, dict(bound.arguments)))
        return bound.arguments

    @staticmethod
    def capture() -> _Event:
        return _Event()

    def low_latency_dispatch(self, *a: Any, **k: Any) -> tuple[Any, ...]:
        args = self._bind("low_latency_dispatch", *a, **k)
        x, ids, n, e = args["x"], args["topk_idx"], args["num_max_dispatch_tokens_per_rank"], \
            args["num_experts"]
        recv = x.new_zeros((e, n, x.shape[1]))  # [E_local, C, H], C = N for one rank
        count = torch.zeros(e, dtype=torch.int32)
        where: dict[tuple[int, int], int] = {}
        for t in range(ids.shape[0]):  # DeepEP fills each expert's rows in token order
            for j in range(ids.shape[1]):
                ex = int(ids[t, j])
                if ex >= 0:
                    where[(t, j)] = int(count[ex])
                    recv[ex, int(count[ex])] = x[t]
                    count[ex] += 1
        return recv, count, (where, n, e), _Event(), lambda: None

    def low_latency_combine(self, *a: Any, **k: Any) -> tuple[Any, ...]:
        args = self._bind("low_latency_combine", *a, **k)
        x, ids, w, (where, _n, _e) = (args["x"], args["topk_idx"], args["topk_weights"],
                                      args["handle"])
        if args.get("overlap"):  # the kernel sends an expert's rows only once it is final
            final = args["src_signals"].view(torch.int32) == args["src_signal_expect_value"]
            assert bool(final.all()), f"combine read unfinished experts: {args['src_signals']}"
        out = torch.zeros((ids.shape[0], x.shape[2]), dtype=torch.float32)
        for (t, j), c in sorted(where.items()):
            out[t] += w[t, j].float() * x[int(ids[t, j]), c].float()
        return out.to(x.dtype), _Event(), lambda: None

    def get_dispatch_layout(self, *a: Any, **k: Any) -> tuple[Any, ...]:
        args = self._bind("get_dispatch_layout", *a, **k)
        ids = args["topk_idx"]
        in_rank = (ids >= 0).any(dim=1, keepdim=True)  # [T, 1]
        per_expert = torch.bincount(ids[ids >= 0], minlength=args["num_experts"])
        return in_rank.sum(0).int(), None, per_expert.int(), in_rank, _Event()

    def dispatch(self, *a: Any, **k: Any) -> tuple[Any, ...]:
        args = self._bind("dispatch", *a, **k)
        mask = args["is_token_in_rank"][:, 0]
        ids, w = args["topk_idx"][mask], args["topk_weights"][mask]
        w = torch.where(ids >= 0, w, 0.0)
        counts = torch.bincount(ids[ids >= 0], minlength=args["num_tokens_per_expert"].numel())
        return args["x"][mask], ids, w, counts.tolist(), mask, _Event()

    def combine(self, *a: Any, **k: Any) -> tuple[Any, ...]:
        args = self._bind("combine", *a, **k)
        mask = args["handle"]
        out = args["x"].new_zeros((mask.shape[0], args["x"].shape[1]))
        out[mask] = args["x"]
        return out, None, _Event()


def _problem(seed: int, t: int = 9, e: int = 8, k: int = 3, h: int = 16, i: int = 8) -> Any:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    ids[0, 1] = -1  # an unrouted slot
    ids[t - 1] = -1  # a token routed nowhere
    weights = torch.rand(t, k, generator=g)
    experts = ReferenceExperts(torch.randn(e, 2 * i, h, generator=g) / 4,
                               torch.randn(e, h, i, generator=g) / 4)
    return hidden, ids, weights, experts


def _run(dispatcher: Any, experts: ReferenceExperts, hidden: torch.Tensor, ids: torch.Tensor,
         weights: torch.Tensor, layout: str, signal: SignalContract | None = None) -> torch.Tensor:
    out = dispatcher.dispatch_recv(dispatcher.dispatch_send(hidden, ids, weights, layout=layout,
                                                            slot=0))
    if layout == "low_latency":
        y = experts.run_low_latency(out)
        if signal is not None:  # a kernel producer marks as tiles finish; here: all, in order
            for unit in range(signal.num_units):
                signal.mark(unit)
    else:
        y = experts.run_normal(out)
    return dispatcher.combine_recv(dispatcher.combine_send(y, out, signal=signal))


def _dispatcher(e: int, n: int, form: Any = None) -> tuple[HarnessDeepEPDispatcher, LoopbackBuffer]:
    plan = plan_deepep_buffer(hidden=16, num_experts=e, world_size=1, max_batch_per_rank=n)
    buf = LoopbackBuffer()
    return HarnessDeepEPDispatcher(buf, plan, combine_form=form), buf


@needs_deep_ep
@pytest.mark.parametrize("layout", ["low_latency", "normal"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dispatcher_matches_reference(layout: str, seed: int) -> None:
    hidden, ids, weights, experts = _problem(seed)
    want = _run(LocalDispatcher(8, 9), experts, hidden, ids, weights, layout)
    disp, buf = _dispatcher(8, 9)
    got = _run(disp, experts, hidden, ids, weights, layout)
    diff = (got - want).abs().max().item()
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), f"{layout=} {seed=} {diff=}"
    assert got[-1].abs().max() == 0  # the token routed nowhere gets zeros
    assert buf.calls and all(name in buf.sigs for name, _ in buf.calls)


@needs_deep_ep
def test_sbo_per_expert_form_reaches_combine() -> None:
    hidden, ids, weights, experts = _problem(3)
    layout = plan_sbo_layout(num_local_experts=8, capacity=9, block_m=4, block_n=8, hidden=16,
                             num_sms=132, comm_num_sms=3, granularity="expert")
    want = _run(LocalDispatcher(8, 9), experts, hidden, ids, weights, "low_latency")
    disp, buf = _dispatcher(8, 9, form="per_expert")
    got = _run(disp, experts, hidden, ids, weights, "low_latency", SignalContract(layout, "cpu"))
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    (name, args), = [c for c in buf.calls if c[0] == "low_latency_combine"]
    assert args["overlap"] is True and args["src_signal_expect_value"] == layout.expect_value
    assert args["src_signals"].dtype == torch.uint32 and args["src_signals"].shape == (8,)


@needs_deep_ep
def test_unmarked_expert_is_caught_by_the_stand_in() -> None:
    hidden, ids, weights, experts = _problem(4)
    layout = plan_sbo_layout(num_local_experts=8, capacity=9, block_m=4, block_n=8, hidden=16,
                             num_sms=132, comm_num_sms=3, granularity="expert")
    disp, _ = _dispatcher(8, 9, form="per_expert")
    out = disp.dispatch_recv(disp.dispatch_send(hidden, ids, weights, layout="low_latency",
                                                slot=0))
    signal = SignalContract(layout, "cpu")
    signal.mark(0)
    with pytest.raises(AssertionError, match="unfinished experts"):
        disp.combine_send(experts.run_low_latency(out), out, signal=signal)


@needs_deep_ep
def test_block_signal_without_per_block_form_waits_then_combines_plainly() -> None:
    hidden, ids, weights, experts = _problem(5)
    layout = plan_sbo_layout(num_local_experts=8, capacity=9, block_m=4, block_n=8, hidden=16,
                             num_sms=132, comm_num_sms=3, granularity="block")
    want = _run(LocalDispatcher(8, 9), experts, hidden, ids, weights, "low_latency")
    disp, buf = _dispatcher(8, 9, form="per_expert")
    out = disp.dispatch_recv(disp.dispatch_send(hidden, ids, weights, layout="low_latency",
                                                slot=0))
    signal = SignalContract(layout, "cpu")
    y = experts.run_low_latency(out, signal=signal)  # lazy producer: finished by the combine
    got = disp.combine_recv(disp.combine_send(y, out, signal=signal))
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    (_, args), = [c for c in buf.calls if c[0] == "low_latency_combine"]
    assert not args.get("overlap")
