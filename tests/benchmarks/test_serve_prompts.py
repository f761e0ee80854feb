"""benchmarks/serve/serve_suite.py's token checks are deterministic in what the scheduler does:
the batch fits one prefill chunk, so no prompt is cut where arrival order decides (on an H100 two
long prompts of a batch were cut elsewhere than in the baseline's run and differed from their
first token, 2026-12-07). Counted with the served model's tokenizer (make_model.py writes the CPU
kit's)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.serve import serve_suite
from tests.kit.make_tiny_dsv3 import write_tokenizer


def test_the_batch_fits_one_prefill_chunk_and_each_long_prompt_goes_alone(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    write_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    batch = [len(tok(p)["input_ids"]) for p in serve_suite.BATCH]
    assert len(set(serve_suite.BATCH)) == len(serve_suite.BATCH) == 8
    assert sum(batch) <= serve_suite.TOKENS, (batch, serve_suite.TOKENS)
    # the long prompts together are over a chunk (why they go one at a time), each alone fits one
    single = [len(tok(p)["input_ids"]) for p in serve_suite.PROMPTS]
    assert sum(single) > serve_suite.TOKENS >= max(single), single
