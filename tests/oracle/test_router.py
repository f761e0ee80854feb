"""The DeepSeek-V3 router against a brute-force per-token reference, plus config validation."""

from __future__ import annotations

import math

import pytest
import torch

from tests.oracle.router import RouterConfig, gate_logits, select_experts


def brute_force(logits: list[float], bias: list[float], cfg: RouterConfig
                ) -> tuple[list[int], list[float]]:
    """One token, plain Python: the DeepSeek-V3 / SGLang biased_grouped_topk rule."""
    e = len(logits)
    scores = [1.0 / (1.0 + math.exp(-x)) for x in logits]
    choice = [s + b for s, b in zip(scores, bias, strict=True)]
    per = e // cfg.n_group
    groups = [sorted(choice[g * per : (g + 1) * per], reverse=True) for g in range(cfg.n_group)]
    group_score = [g[0] + g[1] if cfg.n_group > 1 else 0.0 for g in groups]
    kept = sorted(range(cfg.n_group), key=lambda g: -group_score[g])[: cfg.topk_group]
    allowed = [i for i in range(e) if i // per in kept]
    ids = sorted(allowed, key=lambda i: -choice[i])[: cfg.top_k]
    w = [scores[i] for i in ids]
    if cfg.renormalize:
        total = sum(w)
        w = [x / total for x in w]
    return ids, [x * cfg.routed_scaling_factor for x in w]


CONFIGS = [
    RouterConfig(16, 4, n_group=4, topk_group=2, routed_scaling_factor=2.5),
    RouterConfig(16, 2, n_group=8, topk_group=1, routed_scaling_factor=1.0),
    RouterConfig(8, 3, n_group=1, topk_group=1, renormalize=False),
    RouterConfig(32, 8, n_group=8, topk_group=4, routed_scaling_factor=2.5),  # V3's shape
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"E{c.num_experts}K{c.top_k}G{c.n_group}")
@pytest.mark.parametrize("seed", range(3))
def test_matches_brute_force(cfg: RouterConfig, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    t = 23
    logits = torch.randn(t, cfg.num_experts, generator=g, dtype=torch.float64).float()
    bias = (torch.randn(cfg.num_experts, generator=g) * 0.3).float()
    ids, weights = select_experts(logits, bias, cfg)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert ids.shape == weights.shape == (t, cfg.top_k)
    for i in range(t):
        want_ids, want_w = brute_force(logits[i].tolist(), bias.tolist(), cfg)
        assert ids[i].tolist() == want_ids, f"{seed=} token={i} {cfg=}"
        torch.testing.assert_close(weights[i], torch.tensor(want_w), rtol=1e-5, atol=1e-6)


def test_gate_is_float32_and_rows_independent() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 64, generator=g).bfloat16()
    w = torch.randn(16, 64, generator=g).bfloat16()
    logits = gate_logits(x, w)
    assert logits.dtype == torch.float32
    assert torch.equal(gate_logits(x[3:4], w), logits[3:4])
    torch.testing.assert_close(logits, x.float() @ w.float().T, rtol=1e-5, atol=1e-5)


def test_empty_batch() -> None:
    cfg = CONFIGS[0]
    ids, w = select_experts(torch.zeros(0, 16), torch.zeros(16), cfg)
    assert ids.shape == w.shape == (0, 4)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_experts": 15, "top_k": 2, "n_group": 4}, "num_experts=15 must be a multiple"),
    ({"num_experts": 16, "top_k": 2, "n_group": 4, "topk_group": 5}, "topk_group=5"),
    ({"num_experts": 16, "top_k": 9, "n_group": 4, "topk_group": 2}, "top_k=9"),
    ({"num_experts": 8, "top_k": 1, "n_group": 8}, "top 2 experts per group"),
])
def test_invalid_configs_name_the_value(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RouterConfig(**kwargs)
