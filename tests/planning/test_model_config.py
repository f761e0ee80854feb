"""Tests for planning/cost/model_config.py: the served model's profile from its HF config."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sglang_overlap.planning.cost.model_config import model_from_hf_config
from sglang_overlap.planning.cost.profiles import ProfileError, load_model

# deepseek-ai/DeepSeek-V3 config.json (the published file, cosmetic keys dropped)
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "first_k_dense_replace": 3, "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
# Qwen/Qwen3-235B-A22B-FP8 config.json
QWEN3_235B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288,
    "mlp_only_layers": [], "moe_intermediate_size": 1536, "num_attention_heads": 64,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
    "num_key_value_heads": 4, "vocab_size": 151936, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
# make_tiny_dsv3.py's model (the CPU e2e servers)
TINY: dict[str, Any] = {
    "model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 128, "num_hidden_layers": 3, "first_k_dense_replace": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "kv_lora_rank": 64, "q_lora_rank": 128,
    "qk_rope_head_dim": 32, "qk_nope_head_dim": 32, "v_head_dim": 32, "head_dim": 32,
    "vocab_size": 1024, "dtype": "bfloat16", "moe_layer_freq": 1,
}

_SHAPE = [f.name for f in dataclasses.fields(load_model("deepseek-v3"))
          if f.name not in ("name", "source")]


@pytest.mark.parametrize(("config", "shipped"), [(DEEPSEEK_V3, "deepseek-v3"),
                                                  (QWEN3_235B, "qwen3-235b-a22b")])
def test_published_configs_give_the_shipped_profiles(config: dict[str, Any], shipped: str) -> None:
    got, want = model_from_hf_config(config), load_model(shipped)
    diff = {k: (getattr(got, k), getattr(want, k)) for k in _SHAPE
            if getattr(got, k) != getattr(want, k)}
    assert not diff, f"{shipped=} {diff=}"


def test_tiny_dsv3_hand_worked() -> None:
    m = model_from_hf_config(TINY, name="tiny")
    assert (m.name, m.hidden, m.num_layers, m.num_dense_layers, m.num_moe_layers) == (
        "tiny", 256, 3, 1, 2)
    assert (m.num_experts, m.topk, m.moe_intermediate, m.num_shared_experts) == (8, 2, 128, 1)
    assert (m.attn_kind, m.num_heads, m.num_kv_heads, m.head_dim, m.v_head_dim) == (
        "mla", 4, 1, 32, 32)
    assert (m.rope_head_dim, m.q_lora_rank, m.kv_lora_rank, m.weight_bytes) == (32, 128, 64, 2.0)


def test_qwen2_moe_shared_expert_and_sparse_step() -> None:
    cfg = {**QWEN3_235B, "num_hidden_layers": 8, "decoder_sparse_step": 2, "mlp_only_layers": [1],
           "shared_expert_intermediate_size": 4 * 1536, "quantization_config": None,
           "torch_dtype": "float16", "num_key_value_heads": None}
    m = model_from_hf_config(cfg)
    # sparse layers: (i + 1) % 2 == 0 and i != 1 -> 3, 5, 7; dense: 0, 1, 2, 4, 6
    assert (m.num_dense_layers, m.num_shared_experts, m.weight_bytes) == (5, 4, 2.0)
    assert (m.attn_kind, m.num_kv_heads, m.head_dim) == ("gqa", 64, 128)


def test_deepseek_moe_layer_freq() -> None:
    m = model_from_hf_config({**DEEPSEEK_V3, "num_hidden_layers": 10, "moe_layer_freq": 2,
                              "first_k_dense_replace": 1})
    assert m.num_dense_layers == 10 - len([i for i in range(1, 10) if i % 2 == 0])


def test_multimodal_wrapper_reads_text_config() -> None:
    m = model_from_hf_config({"model_type": "wrapper", "text_config": QWEN3_235B})
    assert (m.hidden, m.num_experts) == (4096, 128)


@pytest.mark.parametrize(("drop", "needle"), [
    ("n_routed_experts", "missing field 'n_routed_experts' (routed experts per MoE layer"),
    ("moe_intermediate_size", "missing field 'moe_intermediate_size'"),
    ("hidden_size", "missing field 'hidden_size'"),
    ("num_experts_per_tok", "missing field 'num_experts_per_tok'"),
    ("qk_rope_head_dim", "missing field 'qk_rope_head_dim' (MLA rope head dim)"),
    ("vocab_size", "missing field 'vocab_size'"),
])
def test_missing_fields_are_named(drop: str, needle: str) -> None:
    cfg = {k: v for k, v in DEEPSEEK_V3.items() if k != drop}
    with pytest.raises(ProfileError) as info:
        model_from_hf_config(cfg)
    assert needle in str(info.value) and "deepseek_v3" in str(info.value), f"{drop=} {info.value}"


def test_dense_models_and_bad_values_are_refused() -> None:
    llama = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
             "intermediate_size": 14336, "num_attention_heads": 32, "vocab_size": 128256}
    with pytest.raises(ProfileError, match="missing field 'n_routed_experts'.*'num_experts'"):
        model_from_hf_config(llama)
    with pytest.raises(ProfileError, match="not a MoE model"):
        model_from_hf_config({**QWEN3_235B, "num_experts": 1})
    with pytest.raises(ProfileError, match="no decoder layer has a MoE MLP"):
        model_from_hf_config({**DEEPSEEK_V3, "first_k_dense_replace": 61})
    with pytest.raises(ProfileError, match="'hidden_size' must be a non-negative integer"):
        model_from_hf_config({**DEEPSEEK_V3, "hidden_size": "7168"})
