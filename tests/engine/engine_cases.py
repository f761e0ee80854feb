"""Shared by the engine tests: toy batches, running every executor on them, the no-sync guard.

A case is one rank's batch: requests with extend lengths and cached prefixes. `run(case, ...)`
builds fresh state (attention KV cache, dispatcher, layers) so every executor starts from the
same inputs; the executors must then agree bit for bit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from sglang_overlap.engine import executors, toy
from sglang_overlap.engine.reference import LocalDispatcher
from sglang_overlap.engine.router import RouterConfig
from sglang_overlap.engine.stages import AttentionOps, MoeLayer, SboConfig
from sglang_overlap.planning.two_batch import ForwardKind, TwoBatchPlan, plan_two_batch

H, INTER, D, LAYERS = 64, 32, 16, 2
ROUTER = RouterConfig(num_experts=16, top_k=4, n_group=4, topk_group=2, routed_scaling_factor=2.5)


@dataclass(frozen=True)
class Case:
    kind: ForwardKind
    extend_lens: tuple[int, ...]  # new tokens per request (decode: 1 each; verify: draft count)
    prefix_lens: tuple[int, ...]  # cached tokens per request
    seed: int = 0
    router: RouterConfig = ROUTER
    bias: tuple[float, ...] | None = None  # replaces the random correction bias
    threshold: float = 0.48
    attn_tp_size: int = 1

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)

    def plan(self) -> TwoBatchPlan:
        n = self.num_tokens
        if n == 0:
            return plan_two_batch(ForwardKind.IDLE, 0)
        if self.kind is ForwardKind.EXTEND:
            return plan_two_batch(self.kind, n, extend_lens=self.extend_lens,
                                  extend_prefix_lens=self.prefix_lens,
                                  two_chunk_threshold=self.threshold,
                                  attn_tp_size=self.attn_tp_size)
        per = self.extend_lens[0]
        return plan_two_batch(self.kind, n, tokens_per_seq=per, attn_tp_size=self.attn_tp_size)

    def layer_weights(self) -> list[toy.ToyWeights]:
        ws = toy.toy_weights(LAYERS, num_experts=self.router.num_experts, hidden=H, inter=INTER,
                             seed=1234)  # the same on every rank
        if self.bias is None:
            return ws
        bias = torch.tensor(self.bias, dtype=torch.float32)
        return [toy.ToyWeights(w.gate_w, bias, w.w13, w.w2, w.shared_w13, w.shared_w2)
                for w in ws]

    def hidden(self) -> torch.Tensor:
        return torch.randn(self.num_tokens, H, generator=torch.Generator().manual_seed(self.seed))

    def attention(self) -> AttentionOps:
        req = [torch.full((n,), q) for q, n in enumerate(self.extend_lens)]
        pos = [torch.arange(p, p + n) for p, n in zip(self.prefix_lens, self.extend_lens,
                                                        strict=True)]
        max_len = max([p + n for p, n in zip(self.prefix_lens, self.extend_lens, strict=True)],
                      default=1)
        att = toy.ToyAttention(
            torch.cat(req).long() if req else torch.zeros(0, dtype=torch.long),
            torch.cat(pos).long() if pos else torch.zeros(0, dtype=torch.long),
            self.prefix_lens, num_layers=LAYERS, hidden=H, head_dim=D, max_len=max_len,
            seed=self.seed + 1)
        return AttentionOps(att.prepare, att.core)


def local_layers(case: Case, capacity: int) -> list[MoeLayer]:
    return toy.toy_layers(case.layer_weights(), case.router,
                          LocalDispatcher(case.router.num_experts, capacity))


LayerFactory = Callable[[Case], list[MoeLayer]]
SBO_CONFIGS = {
    "sbo_block": SboConfig(granularity="block", block_m=4, block_n=32),
    "sbo_expert": SboConfig(granularity="expert", block_m=8, block_n=64),
}


def run(case: Case, executor: str, make_layers: LayerFactory,
        order_out: list[str] | None = None) -> torch.Tensor:
    """One executor on a fresh copy of the case: 'serial_ll', 'serial_normal', 'tbo',
    'sbo_block', 'sbo_expert'. TBO uses the decode schedule except for extend batches."""
    layers, x, attn = make_layers(case), case.hidden(), case.attention()
    if executor == "serial_ll":
        return executors.execute_serial(layers, x, attention=attn, layout="low_latency")
    if executor == "serial_normal":
        return executors.execute_serial(layers, x, attention=attn, layout="normal")
    if executor == "tbo":
        schedule = "prefill" if case.kind is ForwardKind.EXTEND else "decode"
        return executors.execute_tbo(layers, x, case.plan(), schedule=schedule, attention=attn,
                                     order_out=order_out)
    return executors.execute_sbo(layers, x, SBO_CONFIGS[executor], attention=attn)


EXECUTORS = ("serial_ll", "serial_normal", "tbo", "sbo_block", "sbo_expert")


def assert_bitwise(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not torch.equal(got, want):
        diff = (got - want).abs().max().item()
        bad = int((got != want).any(-1).sum())
        raise AssertionError(f"{what}: not bitwise equal ({diff=} rows_differing={bad})")


FORBIDDEN = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextmanager
def no_host_sync(allowed: Sequence[str] = ("_exchange_counts",)) -> Iterator[None]:
    """Make every Tensor host read raise, except inside functions named in `allowed`."""
    originals = {name: getattr(torch.Tensor, name) for name in FORBIDDEN}

    def guard(name: str, orig: Callable[..., object]) -> Callable[..., object]:
        def guarded(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_code.co_name in allowed:
                    return orig(self, *args, **kwargs)
                frame = frame.f_back
            raise AssertionError(f"host sync on the hot path: Tensor.{name}")
        return guarded

    for name, orig in originals.items():
        setattr(torch.Tensor, name, guard(name, orig))
    try:
        yield
    finally:
        for name, orig in originals.items():
            setattr(torch.Tensor, name, orig)
