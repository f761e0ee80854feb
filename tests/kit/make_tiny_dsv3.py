"""Write a tiny random DeepSeek-V3 checkpoint (MLA + MoE) with an offline byte-level BPE tokenizer.

    python tests/kit/make_tiny_dsv3.py OUT_DIR        # ~6 MB, a few seconds on a CPU

3 layers (the first dense), 8 routed experts + 1 shared, top-2 of 2 groups, vocabulary 1024,
context 4096, seed 0: the same files on every run with the same torch/transformers. The tokenizer
is trained on a few fixed lines, so nothing is downloaded. The config gets the fields SGLang
0.5.23's deepseek_v2.py reads and transformers 5.x no longer writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

VOCAB = 1024
CONTEXT = 4096
SPECIALS = ["<|begin_of_sentence|>", "<|end_of_sentence|>", "<|pad|>", "<|User|>",
            "<|Assistant|>"]
CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello world! What is the capital of France? "
    "Paris is the capital of France. User: hi there. Assistant: hello, how can I help you today? "
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" the and of to in is that for it"
)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<|User|>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|Assistant|>{{ m['content'] }}<|end_of_sentence|>"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|>{% endif %}"
)
# Read by SGLang's deepseek_v2.py; transformers 5.x omits them. The CPU rope factory
# (get_rope_cpu) asserts a deepseek_yarn rope_scaling exists: factor 1 makes it plain rope.
SGLANG_FIELDS = {
    "moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "ep_size": 1,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 1.0,
                        "original_max_position_embeddings": CONTEXT, "beta_fast": 32,
                        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
}


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([CORPUS] * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0],
                                   eos_token=SPECIALS[1], pad_token=SPECIALS[2],
                                   chat_template=CHAT_TEMPLATE, model_max_length=CONTEXT)
    fast.add_tokens([f"<|reserved_{i}|>" for i in range(VOCAB - len(fast))])
    assert len(fast) == VOCAB, len(fast)
    fast.save_pretrained(out)


def write_model(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    torch.manual_seed(0)
    # fields SGLang reads that transformers' signature does not declare (kept as attributes)
    sglang_fields: dict[str, Any] = {"head_dim": 32, "num_nextn_predict_layers": 0}
    cfg = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        n_group=2, topk_group=1, kv_lora_rank=64, q_lora_rank=128, qk_rope_head_dim=32,
        qk_nope_head_dim=32, v_head_dim=32,
        **sglang_fields,
        routed_scaling_factor=2.5, max_position_embeddings=CONTEXT, bos_token_id=0,
        eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(out)
    path = out / "config.json"
    config = json.loads(path.read_text())
    config.update(SGLANG_FIELDS)
    path.write_text(json.dumps(config, indent=2))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python make_tiny_dsv3.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out)
    write_model(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
