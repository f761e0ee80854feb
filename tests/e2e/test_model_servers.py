"""Supported models beyond DeepSeek-V3 (`sglang_overlap/models.py`): a tiny random DeepSeek-V2 in
real SGLang servers (--tp 2, CPU), greedy tokens with the plugin's modes equal to the same server
without the plugin, and each mode's path seen in the server's own log.

The DeepSeek-V2 instance is the tiny DeepSeek-V3 checkpoint's weights under DeepSeek-V2's
config: SGLang builds `DeepseekV2ForCausalLM` with V2's router (softmax scores, group-limited
greedy top-k, no correction bias; the bias tensor is dropped from the checkpoint). Four servers,
one at a time (~40 s each here): without the plugin; TBO (the long prompt alone is cut in two
chunks, the batch split in two); SBO; TBO + SBO with `--overlap-gating auto`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from overlap_runs import A2A, BATCH, LONG, NEW_TOKENS, TP2, WITHOUT_PLUGIN
from servers import Server

pytestmark = pytest.mark.e2e

PORT = 30260
V2_ROUTER = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
             "topk_method": "group_limited_greedy", "scoring_func": "softmax"}
TBO, SBO = "--enable-two-batch-overlap", "--enable-single-batch-overlap"
CONFIGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "dsv2_plain": (TP2, WITHOUT_PLUGIN),
    "dsv2_tbo": ([*A2A, TBO], {}),
    "dsv2_sbo": ([*A2A, SBO], {}),
    "dsv2_auto": ([*A2A, TBO, SBO, "--overlap-gating", "auto", "--overlap-hardware-profile",
                   "H20"], {}),
}


def write_tiny_dsv2(dsv3: Path, out: Path) -> Path:
    """The tiny DeepSeek-V3 checkpoint at `dsv3` rewritten as a DeepSeek-V2 one into `out`."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(dsv3, out, ignore=shutil.ignore_patterns("*.safetensors"))
    for weights in dsv3.glob("*.safetensors"):
        tensors = {k: v for k, v in load_file(weights).items()
                   if "e_score_correction_bias" not in k}
        save_file(tensors, out / weights.name, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update(V2_ROUTER)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def runs(tiny_dsv3: Path, sglang_cpu_env: dict[str, str],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[list[int]], str]]:
    """name -> (greedy token ids of [LONG, *BATCH], the server's log), one server at a time."""
    work = tmp_path_factory.mktemp("model-servers")
    model = write_tiny_dsv2(tiny_dsv3, work / "tiny-dsv2")
    out = {}
    for i, (name, (flags, env)) in enumerate(CONFIGS.items()):
        with Server(name, model, PORT + i, flags, {**sglang_cpu_env, **env}, work) as server:
            ids = server.generate([LONG], NEW_TOKENS) + server.generate(BATCH, NEW_TOKENS)
            out[name] = (ids, server.log_text())
    return out


def _stats(log: str) -> set[str]:
    return set(re.findall(r"\(first (\w+)\)", log))


def test_the_served_model_is_deepseek_v2(runs) -> None:
    log = runs["dsv2_tbo"][1]
    assert "DeepseekV2ForCausalLM" in log or "deepseek_v2" in log, log[-3000:]


@pytest.mark.parametrize("name", ["dsv2_tbo", "dsv2_sbo", "dsv2_auto"])
def test_deepseek_v2_overlap_equals_the_server_without_the_plugin(runs, name: str) -> None:
    want, got = runs["dsv2_plain"][0], runs[name][0]
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g == w, f"{name=} prompt {i}: {g=} {w=}"


def test_deepseek_v2_mode_paths_ran(runs) -> None:
    tbo = _stats(runs["dsv2_tbo"][1])
    assert {"tbo", "two_chunk", "tbo_executor"} <= tbo, tbo
    assert "sbo_down_gemm_signal" in _stats(runs["dsv2_sbo"][1])
    assert any(k.startswith("gate_") for k in _stats(runs["dsv2_auto"][1]))
    assert "sglang-overlap stats" not in runs["dsv2_plain"][1]
