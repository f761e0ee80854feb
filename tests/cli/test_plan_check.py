"""`sglang-overlap check` refuses the expert layouts `plan` refuses (cli/plan.expert_layout_error),
through the fast reader and through SGLang's own parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sglang_overlap.cli.main import main
from tests.conftest import require_module

MODEL = ["--model-path", "deepseek-ai/DeepSeek-V3"]
DSV3 = [*MODEL, "--enable-two-batch-overlap"]
EP72 = ["--tp", "72", "--nnodes", "9", "--moe-a2a-backend", "deepep"]
EP72_REFUSED = ("--ep-size 72 (--tp-size, as --moe-a2a-backend deepep sets) must divide the 256 "
                "routed + 0 redundant experts of deepseek-v3 (--ep-num-redundant-experts 0); "
                "--ep-num-redundant-experts 32 would make 288 = 72 GPUs x 4 experts")


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["check", "--assume-arch", "sm90", "--no-import-check", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(("argv", "line"), [
    ([*DSV3, *EP72], EP72_REFUSED),
    ([*DSV3, *EP72, "--ep-num-redundant-experts", "16", "--enable-eplb"],
     "--ep-size 72 (--tp-size, as --moe-a2a-backend deepep sets) must divide the 256 routed "
     "+ 16 redundant experts of deepseek-v3 "
     "(--ep-num-redundant-experts 16); --ep-num-redundant-experts 32 would make 288"),
    ([*MODEL, "--tp", "72", "--ep", "72"], "--ep-size 72 must divide the 256 routed + 0 "
     "redundant experts of deepseek-v3"),
    ([*MODEL, "--enable-eplb"], "--enable-eplb needs --ep-size > 1 (got 1)"),
])
def test_check_refuses_what_plan_refuses(capsys: pytest.CaptureFixture[str], argv: list[str],
                                         line: str) -> None:
    rc, out, err = _check(capsys, *argv)
    assert rc == 2 and out == "", out
    assert err.startswith(f"sglang-overlap check: error: {line}"), err
    assert err.count("\n") == 1, err


def test_the_json_report_names_the_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _check(capsys, "--json", *DSV3, *EP72)
    data: dict[str, Any] = json.loads(out)
    assert rc == 2 and data["flags"]["errors"] == [EP72_REFUSED] and data["ok"] is False
    assert data["flags"]["read_by"].startswith("the plugin's reader")  # no SGLang import
    rc, out, _ = _check(capsys, "--json", *DSV3, *EP72, "--ep-num-redundant-experts", "32",
                        "--enable-eplb", "--init-expert-location", "counts.json",
                        "--ep-dispatch-algorithm", "static")
    assert json.loads(out)["flags"]["read_by"].startswith("the plugin's reader")
    assert data["tbo"] == {"path": None}


@pytest.mark.parametrize("placement", [["--enable-eplb"], ["--init-expert-location", "c.json"],
                                       []])
def test_ep72_with_32_redundant_experts_is_ready(capsys: pytest.CaptureFixture[str],
                                                 placement: list[str]) -> None:
    rc, out, err = _check(capsys, *DSV3, *EP72, "--ep-num-redundant-experts", "32", *placement)
    assert rc == 0 and "\nready\n" in out, out + err


def test_a_model_directory_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {"architectures": ["DeepseekV3ForCausalLM"], "n_routed_experts": 8,
              "num_experts_per_tok": 2, "hidden_size": 256, "moe_intermediate_size": 64,
              "num_hidden_layers": 3, "first_k_dense_replace": 1, "n_shared_experts": 1,
              "num_attention_heads": 4, "kv_lora_rank": 64, "qk_rope_head_dim": 32,
              "v_head_dim": 64, "qk_nope_head_dim": 64, "q_lora_rank": 0,
              "intermediate_size": 512, "vocab_size": 1000}
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    rc, _, err = _check(capsys, "--model-path", str(model), "--tp", "3", "--ep", "3")
    assert rc == 2 and ("--ep-size 3 must divide the 8 routed + 0 redundant experts of tiny "
                        "(--ep-num-redundant-experts 0); --ep-num-redundant-experts 1 would make "
                        "9 = 3 GPUs x 3 experts") in err, err
    rc, out, err = _check(capsys, "--model-path", str(model), "--tp", "3", "--ep", "3",
                          "--ep-num-redundant-experts", "1")
    assert rc == 0, out + err


def test_a_model_it_cannot_read_is_not_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Without the model's routed experts there is nothing to divide: SGLang decides at start."""
    rc, out, err = _check(capsys, "--model-path", "/nonexistent/m", *EP72)
    assert rc == 0 and "\nready\n" in out, out + err


def test_sglangs_parser_path_refuses_alike(capsys: pytest.CaptureFixture[str]) -> None:
    require_module("sglang")
    rc, out, _ = _check(capsys, "--json", "--full", *DSV3, *EP72)
    data: dict[str, Any] = json.loads(out[out.index("{"):])
    assert data["flags"]["read_by"].startswith("SGLang's parser")
    assert rc == 2 and data["flags"]["errors"] == [EP72_REFUSED]
    rc, out, _ = _check(capsys, "--json", "--full", *DSV3, *EP72, "--ep-num-redundant-experts",
                        "32", "--enable-eplb")
    data = json.loads(out[out.index("{"):])
    assert rc == 0 and data["flags"]["errors"] == [], data["flags"]
