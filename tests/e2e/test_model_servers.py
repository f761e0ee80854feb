"""Supported models beyond DeepSeek-V3 (`sglang_overlap/models.py`): a tiny random DeepSeek-V2 in
real SGLang servers (--tp 2, CPU), greedy tokens with the plugin's modes equal to the same server
without the plugin, and each mode's path seen in the server's own log.

The DeepSeek-V2 instance is the tiny DeepSeek-V3 checkpoint's weights under DeepSeek-V2's
config: SGLang builds `DeepseekV2ForCausalLM` with V2's router (softmax scores, group-limited
greedy top-k, no correction bias; the bias tensor is dropped from the checkpoint). Six servers:
without the plugin; TBO (the long prompt alone is cut in two chunks, the batch split in two);
SBO; TBO + SBO with `--overlap-gating auto`; and on `--moe-a2a-backend deepep` (SGLang's own
DeepEP dispatcher on the kit's deep_ep stand-ins, decode through the stand-in graph backend, as
test_graph_servers.py's `deepep_graphs_*` servers) TBO, and SBO with the shared expert in the
dispatch hook. Each server loads while the one before it answers (their answers are compared,
not timed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from graph_runs import DEEPEP, DEEPEP_CHUNKS, DEEPEP_ENV, GRAPH_BS, GRAPH_ENV
from overlap_runs import A2A, BATCH, LONG, NEW_TOKENS, TP2, WITHOUT_PLUGIN
from servers import Server, one_after_another

from tests.kit import Kit

pytestmark = pytest.mark.e2e

PORT = 30260
REPO = Path(__file__).resolve().parents[2]
V2_ROUTER = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
             "topk_method": "group_limited_greedy", "scoring_func": "softmax"}
TBO, SBO = "--enable-two-batch-overlap", "--enable-single-batch-overlap"
CONFIGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "dsv2_plain": (TP2, WITHOUT_PLUGIN),
    "dsv2_tbo": ([*A2A, TBO], {}),
    "dsv2_sbo": ([*A2A, SBO], {}),
    "dsv2_auto": ([*A2A, TBO, SBO, "--overlap-gating", "auto", "--overlap-hardware-profile",
                   "H20"], {}),
    # on SGLang's DeepEP path (the kit's per-expert stand-ins); the servers' tokens must equal
    # dsv2_plain's, as test_graph_servers.py's deepep_graphs_tbo / _sbo_shared give the V3 ones
    "dsv2_deepep_tbo": ([*DEEPEP, *DEEPEP_CHUNKS, TBO, *GRAPH_BS], {**GRAPH_ENV, **DEEPEP_ENV}),
    "dsv2_deepep_sbo": ([*DEEPEP, SBO, "--sbo-down-gemm-overlap", "off", *GRAPH_BS],
                        {**GRAPH_ENV, **DEEPEP_ENV}),
}
DEEPEP_SERVERS = ("dsv2_deepep_tbo", "dsv2_deepep_sbo")


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


@dataclass(frozen=True)
class ModelRun:
    ids: list[list[int]]
    """Greedy token ids of [LONG, *BATCH]."""
    log: str
    deep_ep: list[dict[str, int]]
    """The deep_ep stand-in's call counters, one per TP rank (deepep servers; else empty)."""


@pytest.fixture(scope="module")
def runs(tiny_dsv3: Path, cpu_kit: Kit, sglang_cpu_env: dict[str, str],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelRun]:
    """name -> the server's ModelRun; each server loads while the one before it answers."""
    work = tmp_path_factory.mktemp("model-servers")
    model = write_tiny_dsv2(tiny_dsv3, work / "tiny-dsv2")
    deepep_path = cpu_kit.env(os.environ, pythonpath=[str(REPO)],
                              deepep_form="per_expert")["PYTHONPATH"]
    servers = []
    for i, (name, (flags, env)) in enumerate(CONFIGS.items()):
        env = {**sglang_cpu_env, **env, "SGLANG_CPU_SHIM_COUNTERS": str(work / name)}
        if name in DEEPEP_SERVERS:
            env["PYTHONPATH"] = deepep_path
        (work / name).mkdir()
        servers.append(Server(name, model, PORT + i, flags, env, work))
    out = {}
    for server in one_after_another(servers):
        ids = server.generate([LONG], NEW_TOKENS) + server.generate(BATCH, NEW_TOKENS)
        counters = [json.loads(p.read_text())
                    for p in sorted((work / server.name).glob("graphs-*.json"))]
        out[server.name] = ModelRun(ids, server.log_text(),
                                    [c["deep_ep"] for c in counters if "deep_ep" in c])
    return out


def _stats(log: str) -> set[str]:
    return set(re.findall(r"\(first (\w+)\)", log))


def test_the_served_model_is_deepseek_v2(runs) -> None:
    log = runs["dsv2_tbo"].log
    assert "DeepseekV2ForCausalLM" in log or "deepseek_v2" in log, log[-3000:]


@pytest.mark.parametrize("name", ["dsv2_tbo", "dsv2_sbo", "dsv2_auto", *DEEPEP_SERVERS])
def test_deepseek_v2_overlap_equals_the_server_without_the_plugin(runs, name: str) -> None:
    want, got = runs["dsv2_plain"].ids, runs[name].ids
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g == w, f"{name=} prompt {i}: {g=} {w=}"


def test_deepseek_v2_mode_paths_ran(runs) -> None:
    tbo = _stats(runs["dsv2_tbo"].log)
    assert {"tbo", "two_chunk", "tbo_executor"} <= tbo, tbo
    assert "sbo_down_gemm_signal" in _stats(runs["dsv2_sbo"].log)
    assert any(k.startswith("gate_") for k in _stats(runs["dsv2_auto"].log))
    assert "sglang-overlap stats" not in runs["dsv2_plain"].log


@pytest.mark.parametrize("name", DEEPEP_SERVERS)
def test_deepseek_v2_on_deepep_dispatches_through_the_stand_in(runs, name: str) -> None:
    calls = runs[name].deep_ep
    assert len(calls) == 2 and calls[0] == calls[1], calls  # one per TP rank, paired up
    n = calls[0]["dispatch"]  # low-latency, prefill included
    assert n == calls[0]["combine"] > 0, calls
    # SGLang's SBO (SM90) runs the shared expert in the dispatch hook, on every dispatch
    assert calls[0].get("dispatch_hooks", 0) == (n if name == "dsv2_deepep_sbo" else 0), calls
    # TBO on the DeepEP path: upstream's overlapped executor on two inner dispatchers
    assert ("(first tbo_executor)" in runs[name].log) == (name == "dsv2_deepep_tbo")
