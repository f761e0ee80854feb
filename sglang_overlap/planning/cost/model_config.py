"""The cost model's profile of the model actually served, from its Hugging Face config.

`model_from_hf_config(config)` reads the plain dict of a `config.json` (or of
`PretrainedConfig.to_dict()`) and returns the `ModelProfile` the cost model prices: hidden size,
routed / shared experts and their intermediate size, top-k, how many layers are dense, the
vocabulary, and the attention (MLA with its LoRA ranks and head dims, or GQA with its heads).

Understood spellings (checked against published configs):
- DeepSeek-V2/V3/R1 (`n_routed_experts`, `n_shared_experts`, `first_k_dense_replace`,
  `moe_layer_freq`, `kv_lora_rank`, `q_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`,
  `v_head_dim`);
- Qwen2-MoE / Qwen3-MoE (`num_experts`, `decoder_sparse_step`, `mlp_only_layers`,
  `shared_expert_intermediate_size`, GQA with `head_dim`);
- any config with those fields; a multimodal wrapper's `text_config` is read in its place.
A field the cost model needs and the config lacks raises ProfileError naming it, so an
unsupported model is refused when the server starts, not mid-serving.

Plain Python; mypy --strict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_overlap.planning.cost.profiles import ModelProfile, ProfileError

EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")
_FP8_METHODS = frozenset({"fp8", "fbgemm_fp8", "w8a8_fp8", "modelopt_fp8", "compressed-tensors"})
_DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0,
                "float8_e4m3fn": 1.0}


def _origin(config: Mapping[str, Any]) -> str:
    name = config.get("_name_or_path") or config.get("model_type") or "model"
    return f"model config {name!r}"


def _first(config: Mapping[str, Any], keys: tuple[str, ...], what: str) -> int:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return _int(config, key, value)
    raise ProfileError(f"{_origin(config)}: missing field {keys[0]!r} ({what}; also looked for "
                       f"{', '.join(repr(k) for k in keys[1:])}): the overlap cost model supports "
                       "MoE models with DeepSeek-V3 or Qwen3-MoE style configs")


def _int(config: Mapping[str, Any], key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProfileError(f"{_origin(config)}: field {key!r} must be a non-negative integer "
                           f"(got {value!r})")
    return value


def _need(config: Mapping[str, Any], key: str, what: str) -> int:
    value = config.get(key)
    if value is None:
        raise ProfileError(f"{_origin(config)}: missing field {key!r} ({what}), needed by the "
                           "overlap cost model for --overlap-gating auto")
    return _int(config, key, value)


def _opt(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key)
    return default if value is None else _int(config, key, value)


def _is_sparse(config: Mapping[str, Any], layer: int) -> bool:
    """Whether decoder layer `layer` has a MoE MLP (the model's own rule)."""
    if "first_k_dense_replace" in config or "moe_layer_freq" in config:  # DeepSeek
        freq = max(1, _opt(config, "moe_layer_freq", 1))
        return layer >= _opt(config, "first_k_dense_replace", 0) and layer % freq == 0
    only_dense = config.get("mlp_only_layers") or ()
    step = max(1, _opt(config, "decoder_sparse_step", 1))  # Qwen-MoE
    return layer not in only_dense and (layer + 1) % step == 0


def _weight_bytes(config: Mapping[str, Any]) -> float:
    quant = config.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        if method in _FP8_METHODS or quant.get("fmt") == "e4m3":
            return 1.0
        bits = quant.get("bits") or quant.get("w_bit")
        if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0:
            return bits / 8.0
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return _DTYPE_BYTES.get(dtype.removeprefix("torch."), 2.0)


def model_from_hf_config(config: Mapping[str, Any], *, name: str | None = None,
                         weight_bytes: float | None = None,
                         kv_cache_bytes: float = 2.0) -> ModelProfile:
    """The ModelProfile of a model from its HF config dict.

    `weight_bytes` overrides what the config implies (fp8 quantization: 1, else its dtype), e.g.
    with the server's --dtype or --quantization; `kv_cache_bytes` is the KV cache element size.
    Raises ProfileError naming the first missing or malformed field.
    """
    text = config.get("text_config")
    if isinstance(text, Mapping) and not any(k in config for k in EXPERT_KEYS):
        config = {**text, "_name_or_path": config.get("_name_or_path", text.get("model_type"))}
    hidden = _need(config, "hidden_size", "model width")
    layers = _need(config, "num_hidden_layers", "decoder layers")
    experts = _first(config, EXPERT_KEYS, "routed experts per MoE layer")
    if experts < 2:
        raise ProfileError(f"{_origin(config)}: {experts} routed experts is not a MoE model; "
                           "--overlap-gating auto has nothing to overlap")
    topk = _first(config, TOPK_KEYS, "experts each token is routed to")
    moe_inter = _need(config, "moe_intermediate_size", "routed expert intermediate size")
    shared = _opt(config, "n_shared_experts", 0)
    if not shared and config.get("shared_expert_intermediate_size"):
        shared_inter = _opt(config, "shared_expert_intermediate_size", 0)
        shared = -(-shared_inter // max(1, moe_inter))
    dense = sum(1 for i in range(layers) if not _is_sparse(config, i))
    if dense == layers:
        raise ProfileError(f"{_origin(config)}: no decoder layer has a MoE MLP "
                           "(first_k_dense_replace / mlp_only_layers cover all of them)")
    heads = _need(config, "num_attention_heads", "attention heads")
    if config.get("kv_lora_rank"):  # MLA
        attn: dict[str, Any] = {
            "attn_kind": "mla", "num_heads": heads, "num_kv_heads": 1,
            "head_dim": _need(config, "qk_nope_head_dim", "MLA query/key head dim without rope"),
            "v_head_dim": _need(config, "v_head_dim", "MLA value head dim"),
            "rope_head_dim": _need(config, "qk_rope_head_dim", "MLA rope head dim"),
            "q_lora_rank": _opt(config, "q_lora_rank", 0),
            "kv_lora_rank": _need(config, "kv_lora_rank", "MLA latent KV rank"),
        }
    else:  # GQA (MHA when num_key_value_heads is absent)
        head_dim = _opt(config, "head_dim", hidden // max(1, heads))
        attn = {"attn_kind": "gqa", "num_heads": heads,
                "num_kv_heads": _opt(config, "num_key_value_heads", heads), "head_dim": head_dim,
                "v_head_dim": head_dim, "rope_head_dim": 0, "q_lora_rank": 0, "kv_lora_rank": 0}
    return ModelProfile(
        name=name or str(config.get("_name_or_path") or config.get("model_type") or "model"),
        hidden=hidden, num_layers=layers, num_dense_layers=dense, num_experts=experts,
        topk=topk, moe_intermediate=moe_inter, num_shared_experts=shared,
        dense_intermediate=_need(config, "intermediate_size", "dense MLP intermediate size")
        if dense else _opt(config, "intermediate_size", 0),
        vocab=_need(config, "vocab_size", "vocabulary size"),
        weight_bytes=_weight_bytes(config) if weight_bytes is None else weight_bytes,
        kv_cache_bytes=kv_cache_bytes,
        source=f"{_origin(config)} (served model's config)",
        **attn,
    )


__all__ = ["EXPERT_KEYS", "TOPK_KEYS", "model_from_hf_config"]
