"""Tests for `sglang-overlap plan` (cli/plan.py) and its timeline picture (cli/timeline.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_overlap.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_default_plan_recommends_sbo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v3 decode on H20: EP16 over 2 node(s) x 8 GPUs" in out
    assert "recommended: sbo" in out
    row = next(line for line in out.splitlines() if line.startswith("sbo "))
    assert "<- recommended" in row and "+6." in row, row


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recommended"] == "sbo"
    for mode in ("none", "tbo", "sbo"):
        entry = data["modes"][mode]
        assert entry["throughput_per_gpu"] > 0 and isinstance(entry["gain_vs_none"], float)
    assert 0.037 <= data["modes"]["sbo"]["gain_vs_none"] <= 0.097
    assert data["modes"]["tbo"]["gain_vs_none"] < 0
    assert data["modes"]["none"]["gain_vs_none"] == 0.0


def test_flags_change_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json", "--gpu", "H200", "--phase", "prefill", "--ep", "32",
                 "--tokens-per-gpu", "4096", "--context-len", "4096"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"] == "H200" and data["deployment"]["phase"] == "prefill"
    assert not data["modes"]["sbo"]["applicable"]
    assert data["modes"]["two_chunk"]["gain_vs_none"] > data["modes"]["tbo"]["gain_vs_none"]


def test_bad_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "A100"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "unknown hardware profile 'A100'" in out.err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["plan", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("sglang", "old"), [
    (["--model-path", "deepseek-ai/DeepSeek-V3", "--ep-size", "32"], ["--model", "deepseek-v3",
                                                                     "--ep", "32"]),
    (["--model-path", "deepseek-ai/DeepSeek-R1", "--expert-parallel-size", "8"],
     ["--model", "deepseek-r1", "--ep", "8"]),
    (["--model-path", "Qwen/Qwen3-235B-A22B", "--ep-size", "8"],
     ["--model", "qwen3-235b", "--ep", "8"]),
    (["--tp-size", "16", "--nnodes", "2", "--attn-dp-size", "16"], []),
    (["--tp", "16", "--enable-dp-attention", "--dp", "16"],
     ["--ep", "16", "--gpus-per-node", "16"]),
    (["--tensor-parallel-size", "8"], ["--ep", "8", "--gpus-per-node", "8",
                                       "--no-dp-attention"]),
])
def test_sglangs_flag_names_and_the_old_ones_plan_alike(
        capsys: pytest.CaptureFixture[str], sglang: list[str], old: list[str]) -> None:
    assert _json(capsys, *sglang) == _json(capsys, *old)


@pytest.mark.parametrize(("argv", "error"), [
    (["--ep", "7"], "--ep-size 7 must divide the 256 routed + 0 redundant experts of "
     "deepseek-v3 (--ep-num-redundant-experts 0); --ep-num-redundant-experts 3 would make 259 = "
     "7 GPUs x 37 experts"),
    (["--ep", "72"], "--ep-size 72 must divide the 256 routed + 0 redundant experts of "
     "deepseek-v3 (--ep-num-redundant-experts 0); --ep-num-redundant-experts 32 would make 288 = "
     "72 GPUs x 4 experts\n"),
    (["--tp", "72", "--nnodes", "9", "--ep-num-redundant-experts", "16"],
     "--ep-size 72 must divide the 256 routed + 16 redundant experts of deepseek-v3 "
     "(--ep-num-redundant-experts 16); --ep-num-redundant-experts 32 would make 288"),
    (["--ep-num-redundant-experts", "-1"], "--ep-num-redundant-experts must be >= 0 (got -1)"),
    (["--ep", "1", "--enable-eplb"], "--enable-eplb needs --ep-size > 1 (got 1)"),
    (["--tp", "16", "--ep", "3"], "--ep-size 3 must divide --tp-size 16"),
    (["--tp", "16", "--nnodes", "3"], "--nnodes 3 must divide --tp-size 16"),
    (["--tp", "0"], "--tp-size must be >= 1 (got 0)"),
    (["--tbo-token-distribution-threshold", "0.9"],
     "--tbo-token-distribution-threshold must be in [0, 0.5] (got 0.9)"),
    (["--tbo-token-distribution-threshold", "0.9", "--phase", "prefill"],
     "--tbo-token-distribution-threshold must be in [0, 0.5] (got 0.9)"),
])
def test_the_servers_range_checks_on_stderr(capsys: pytest.CaptureFixture[str], argv: list[str],
                                            error: str) -> None:
    assert main(["plan", "--json", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(f"sglang-overlap plan: error: {error}"), out.err


@pytest.mark.parametrize("phase", ["decode", "prefill"])
@pytest.mark.parametrize("threshold", ["0", "0.5"])
def test_every_threshold_the_server_accepts_plans(capsys: pytest.CaptureFixture[str],
                                                  phase: str, threshold: str) -> None:
    from sglang_overlap.settings import OverlapSettings, ServerFacts, validate_settings

    validate_settings(OverlapSettings(tbo_token_distribution_threshold=float(threshold)),
                      ServerFacts())
    data = _json(capsys, "--phase", phase, "--tbo-token-distribution-threshold", threshold)
    assert data["deployment"]["two_chunk_threshold"] == float(threshold)


def test_model_help_puts_each_alias_with_its_model(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "(deepseek-v3, deepseek-r1, dsv3; qwen3-235b-a22b, qwen3-235b)" in flat
    assert "(alias deepseek-r1)" not in flat


def test_a_model_directory_is_read_from_its_config(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_overlap.planning.cost.profiles import load_model

    ref = load_model("deepseek-v3")
    config = {"architectures": ["DeepseekV3ForCausalLM"], "n_routed_experts": 64,
              "num_experts_per_tok": 8, "hidden_size": 1024, "moe_intermediate_size": 256,
              "num_hidden_layers": 4, "first_k_dense_replace": 1, "n_shared_experts": 1,
              "num_attention_heads": 8, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
              "v_head_dim": 128, "qk_nope_head_dim": 128, "q_lora_rank": 1536,
              "intermediate_size": 2048, "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    data = _json(capsys, "--model-path", str(tmp_path), "--ep-size", "8")
    assert data["model"] == tmp_path.name.lower() and data["model"] != ref.name
    assert main(["plan", "--model-path", str(tmp_path), "--ep-size", "48"]) == 2
    assert ("--ep-size 48 must divide the 64 routed + 0 redundant experts of "
            f"{tmp_path.name.lower()} (--ep-num-redundant-experts 0); --ep-num-redundant-experts "
            "32 would make 96 = 48 GPUs x 2 experts") in capsys.readouterr().err
    data = _json(capsys, "--model-path", str(tmp_path), "--ep-size", "48",
                 "--ep-num-redundant-experts", "32", "--enable-eplb")
    assert data["experts"]["per_gpu"] == 2


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    assert main(["plan", "--plot", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, len(data)
    assert str(png) in capsys.readouterr().out


def test_plan_imports_neither_torch_nor_sglang() -> None:
    """What keeps `plan` fast (0.25 s on an idle machine): no heavy import. Its speed itself is
    not asserted (a timed test fails on a loaded machine)."""
    code = ("import sys; from sglang_overlap.cli.main import main; rc = main(['plan']); "
            "heavy = [m for m in ('torch', 'sglang', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


LMSYS_DECODE = ["--model-path", "deepseek-ai/DeepSeek-V3", "--gpu", "H100", "--tp", "72",
                "--nnodes", "9", "--attn-dp-size", "72", "--ep-num-redundant-experts", "32",
                "--tokens-per-gpu", "128"]
"""LMSYS's DeepSeek-V3 decode on 9 nodes of 8 H100 (EP72, 32 redundant experts, EPLB placement
from expert counts)."""


@pytest.mark.parametrize("placement", [["--enable-eplb"], ["--init-expert-location", "c.json"],
                                       ["--ep-dispatch-algorithm", "static"]])
def test_ep72_with_32_redundant_experts_plans_four_experts_per_gpu(
        capsys: pytest.CaptureFixture[str], placement: list[str]) -> None:
    assert main(["plan", *LMSYS_DECODE, *placement]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deepseek-v3 decode on H100: EP72 over 9 node(s) x 8 GPUs, 4 "
                          "experts/GPU (256 routed + 32 redundant), DP attention"), out
    assert "note:" not in out
    data = _json(capsys, *LMSYS_DECODE, *placement)
    assert data["experts"] == {"routed": 256, "redundant": 32, "physical": 288, "per_gpu": 4,
                               "redundant_receive_tokens": True, "note": ""}
    assert data["deployment"]["num_redundant_experts"] == 32


def test_idle_redundant_experts_are_named_and_priced(capsys: pytest.CaptureFixture[str]) -> None:
    """Without EPLB's placement or dispatch, SGLang routes no token to the copies: the note says
    so, and the busiest rank's four experts each get a routed expert's full share."""
    assert main(["plan", *LMSYS_DECODE]) == 0
    out = capsys.readouterr().out
    assert ("note: the 32 redundant experts get no tokens: with --init-expert-location trivial, "
            "no --enable-eplb and no --ep-dispatch-algorithm, SGLang routes each token to its "
            "logical expert's own slot\n") in out
    idle = _json(capsys, *LMSYS_DECODE)
    used = _json(capsys, *LMSYS_DECODE, "--enable-eplb")
    assert idle["experts"]["redundant_receive_tokens"] is False and idle["experts"]["note"]
    assert idle["modes"]["none"]["step_ms"] > used["modes"]["none"]["step_ms"]


def test_ep32_without_redundancy_is_eight_experts_per_gpu(
        capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--ep", "32")
    assert data["experts"]["per_gpu"] == 8 and data["experts"]["redundant"] == 0
    assert main(["plan", "--ep", "32"]) == 0
    assert ", 8 experts/GPU (256 routed + 0 redundant), " in capsys.readouterr().out


def test_redundant_experts_change_the_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    """EP32 + 32 redundant (9 per GPU) costs one more expert's weights per rank than EP32."""
    plain = _json(capsys, "--ep", "32", "--gpu", "H100")
    more = _json(capsys, "--ep", "32", "--gpu", "H100", "--ep-num-redundant-experts", "32",
                 "--enable-eplb")
    assert more["experts"]["per_gpu"] == 9
    assert more["modes"]["none"]["layer_us"] > plain["modes"]["none"]["layer_us"]
