"""Write a random DeepSeek-V3 checkpoint at real width, fp8 block-quantized like the real one.

    python3 benchmarks/serve/make_model.py OUT_DIR --moe-layers N [--dense-layers 1] [--seed 0]

Architecture as deepseek-ai/DeepSeek-V3's config.json: hidden 7168, MLA (128 heads, q_lora 1536,
kv_lora 512, rope 64, nope 128, v 128), 256 routed experts (moe_intermediate 2048), top-8 of
8 groups (topk_group 4, sigmoid scores, noaux_tc, routed_scaling_factor 2.5) + 1 shared expert,
dense MLP 18432, yarn rope; `quantization_config` fp8 e4m3 with 128x128 weight blocks
(`weight_scale_inv` [ceil(N/128), ceil(K/128)] float32). Fewer layers than the real 61
(`--dense-layers` dense, then `--moe-layers` MoE), no MTP layer, and the offline byte-level BPE
tokenizer of the CPU kit (vocabulary 1024), so nothing is downloaded.

Weights are drawn on the GPU (seeded): each linear has std 1/sqrt(fan_in) (its fp8 payload N(0,1)
and a per-block scale 1/sqrt(fan_in) * U(0.5, 1.5)), so every sublayer adds O(1) to the residual
stream and the MoE output decides the tokens; the LM head is scaled so logits have std ~3 (few
near-ties between the top two tokens). One safetensors shard per layer, written as it is drawn.
A routed MoE layer is 11.3 GB; the whole checkpoint is printed at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
HIDDEN, VOCAB, BLOCK = 7168, 1024, 128
HEADS, Q_LORA, KV_LORA, ROPE, NOPE, V_DIM = 128, 1536, 512, 64, 128, 128
EXPERTS, MOE_INTER, DENSE_INTER, TOPK = 256, 2048, 18432, 8


def config(num_layers: int, dense: int) -> dict[str, object]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": DENSE_INTER,
        "moe_intermediate_size": MOE_INTER, "num_hidden_layers": num_layers,
        "first_k_dense_replace": dense, "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS, "n_routed_experts": EXPERTS, "n_shared_experts": 1,
        "num_experts_per_tok": TOPK, "n_group": 8, "topk_group": 4, "moe_layer_freq": 1,
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
        "routed_scaling_factor": 2.5, "kv_lora_rank": KV_LORA, "q_lora_rank": Q_LORA,
        "qk_rope_head_dim": ROPE, "qk_nope_head_dim": NOPE, "v_head_dim": V_DIM,
        "num_nextn_predict_layers": 0, "ep_size": 1, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "max_position_embeddings": 163840, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0},
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "torch_dtype": "bfloat16",
        "initializer_range": 0.02, "use_cache": True,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic",
                                "weight_block_size": [BLOCK, BLOCK]},
    }


class Drawer:
    """Seeded random tensors on the GPU."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(seed)

    def normal(self, *shape: int, std: float, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=self.gen) * std).to(dtype)

    def fp8_linear(self, out: dict[str, torch.Tensor], name: str, n: int, k: int) -> None:
        """`name`.weight [n, k] float8_e4m3fn, `name`.weight_scale_inv [ceil(n/128),
        ceil(k/128)] float32: dequantized std 1/sqrt(k)."""
        w = torch.randn(n, k, device="cuda", generator=self.gen).to(torch.float8_e4m3fn)
        nb, kb = math.ceil(n / BLOCK), math.ceil(k / BLOCK)
        u = torch.rand(nb, kb, device="cuda", generator=self.gen)
        out[f"{name}.weight"] = w
        out[f"{name}.weight_scale_inv"] = (0.5 + u) / math.sqrt(k)


def layer(d: Drawer, i: int, dense: bool) -> dict[str, torch.Tensor]:
    p, t = f"model.layers.{i}", {}
    ones = lambda n: torch.ones(n, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    t[f"{p}.input_layernorm.weight"] = ones(HIDDEN)
    t[f"{p}.post_attention_layernorm.weight"] = ones(HIDDEN)
    a = f"{p}.self_attn"
    d.fp8_linear(t, f"{a}.q_a_proj", Q_LORA, HIDDEN)
    t[f"{a}.q_a_layernorm.weight"] = ones(Q_LORA)
    d.fp8_linear(t, f"{a}.q_b_proj", HEADS * (NOPE + ROPE), Q_LORA)
    d.fp8_linear(t, f"{a}.kv_a_proj_with_mqa", KV_LORA + ROPE, HIDDEN)
    t[f"{a}.kv_a_layernorm.weight"] = ones(KV_LORA)
    d.fp8_linear(t, f"{a}.kv_b_proj", HEADS * (NOPE + V_DIM), KV_LORA)
    d.fp8_linear(t, f"{a}.o_proj", HIDDEN, HEADS * V_DIM)
    m = f"{p}.mlp"
    if dense:
        d.fp8_linear(t, f"{m}.gate_proj", DENSE_INTER, HIDDEN)
        d.fp8_linear(t, f"{m}.up_proj", DENSE_INTER, HIDDEN)
        d.fp8_linear(t, f"{m}.down_proj", HIDDEN, DENSE_INTER)
        return t
    t[f"{m}.gate.weight"] = d.normal(EXPERTS, HIDDEN, std=1 / math.sqrt(HIDDEN))
    t[f"{m}.gate.e_score_correction_bias"] = torch.zeros(EXPERTS, device="cuda")
    for e in [*(f"experts.{j}" for j in range(EXPERTS)), "shared_experts"]:
        d.fp8_linear(t, f"{m}.{e}.gate_proj", MOE_INTER, HIDDEN)
        d.fp8_linear(t, f"{m}.{e}.up_proj", MOE_INTER, HIDDEN)
        d.fp8_linear(t, f"{m}.{e}.down_proj", HIDDEN, MOE_INTER)
    return t


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--moe-layers", type=int, required=True)
    ap.add_argument("--dense-layers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT))
    from tests.kit.make_tiny_dsv3 import write_tokenizer

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    write_tokenizer(out)
    n = args.dense_layers + args.moe_layers
    (out / "config.json").write_text(json.dumps(config(n, args.dense_layers), indent=2))
    d, index, total = Drawer(args.seed), {}, 0
    def head() -> dict[str, torch.Tensor]:
        return {"model.embed_tokens.weight": d.normal(VOCAB, HIDDEN, std=1.0),
                "model.norm.weight": torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16),
                "lm_head.weight": d.normal(VOCAB, HIDDEN, std=3.0 / math.sqrt(HIDDEN))}

    shards: list[tuple[str, Callable[[], dict[str, torch.Tensor]]]] = [
        (f"model-{i:05d}.safetensors", functools.partial(layer, d, i, i < args.dense_layers))
        for i in range(n)]
    shards.append(("model-head.safetensors", head))
    for fname, draw in shards:
        tensors = {k: v.cpu() for k, v in draw().items()}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        total += sum(v.numel() * v.element_size() for v in tensors.values())
        index.update({k: fname for k in tensors})
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": index}, indent=1))
    print(f"make_model: {n} layers ({args.moe_layers} MoE), {total / 2**30:.1f} GiB in "
          f"{time.time() - t0:.0f} s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
