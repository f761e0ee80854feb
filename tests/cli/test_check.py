"""`sglang-overlap check` through the real CLI entry point, SGLang parser and installed wheels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_module

require_module("sglang")

from sglang_overlap.cli.main import main  # noqa: E402
from sglang_overlap.kernels.capabilities import package_dir  # noqa: E402

HAS_TRITON = package_dir("triton") is not None


@pytest.fixture(scope="module")
def model(tiny_dsv3: Path) -> list[str]:
    return ["--model-path", str(tiny_dsv3), "--device", "cpu"]


@pytest.fixture(scope="module")
def sbo(model: list[str]) -> list[str]:
    return ["--enable-single-batch-overlap", "--moe-a2a-backend", "deepep", "--tp", "2", *model]


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main(["check", "--json", "--no-import-check", *argv])
    out = capsys.readouterr().out
    return rc, json.loads(out[out.index("{"):])


def test_bare_check_reports_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    rc, out = _check(capsys)
    assert rc == 0 and out["ok"]
    assert out["machine"]["cpu_only"] == (not torch.cuda.is_available())
    assert out["sglang"]["version"] == "0.5.23"
    assert out["sglang"]["plugin_discovered"] and out["sglang"]["plugin_loaded"]
    assert out["sbo"]["path"] == "off" and out["tbo"]["path"] == "off"
    if package_dir("deep_ep") is not None:
        assert out["kernels"]["deep_ep"]["low_latency_combine_overlap"] == "per-expert form"
        assert out["kernels"]["deep_gemm"]["masked_gemm_with_signals"] is False


@pytest.mark.skipif(not HAS_TRITON, reason="per-expert needs triton for the signal GEMM")
def test_hopper_box_picks_per_expert(capsys: pytest.CaptureFixture[str], sbo: list[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "sm90", *sbo)
    assert rc == 0, out
    assert out["machine"]["capability"] == [9, 0] and out["machine"]["gpu_source"] == "assumed"
    assert out["sbo"]["path"] == "per_expert"


def test_cpu_machine_cannot_run_deepep_sbo(capsys: pytest.CaptureFixture[str],
                                           sbo: list[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "cpu", *sbo)
    assert rc == 1 and not out["ok"]
    assert "--assume-arch sm90" in out["sbo"]["refusal"]


def test_forced_block_granularity_is_refused(capsys: pytest.CaptureFixture[str],
                                            sbo: list[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "sm90", *sbo, "--sbo-signal-granularity", "block")
    assert rc == 1
    assert "sgl-deep-ep 0.1.2.post1" in out["sbo"]["refusal"]
    assert "comp_signal" in out["sbo"]["refusal"]


def test_invalid_plugin_flags_fail_with_their_names(capsys: pytest.CaptureFixture[str],
                                                    model: list[str]) -> None:
    rc, out = _check(capsys, *model, "--sbo-down-gemm-overlap", "force")
    assert rc == 1
    assert any("--sbo-down-gemm-overlap needs --enable-single-batch-overlap" in e
               for e in out["flags"]["errors"]), out["flags"]


def test_tbo_path_is_described(capsys: pytest.CaptureFixture[str], model: list[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "sm90", "--enable-two-batch-overlap",
                     "--moe-a2a-backend", "deepep", "--tp", "2", *model)
    assert rc == 0, out
    assert out["tbo"]["path"].startswith("on (deepep; always)")
    assert "two-chunk at t=0.48" in out["tbo"]["path"]


def test_text_report_with_import_check(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    rc = main(["check", "--assume-arch", "sm90"])
    text = capsys.readouterr().out
    assert rc == 0 and "SBO: off" in text and "ready" in text
    assert "GPU (assumed): assumed SM90" in text
    if package_dir("deep_ep") is not None and not torch.cuda.is_available():
        assert "deep_ep 0.1.2.post1: does not import (ImportError" in text


def test_rejected_server_flags_still_report_the_overlap_paths(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "sm90", "--enable-single-batch-overlap",
                     "--moe-a2a-backend", "deepep", "--no-such-sglang-flag")
    assert rc == 2 and any("rejected" in e for e in out["flags"]["errors"])
    assert out["sbo"]["path"] == ("per_expert" if HAS_TRITON else "shared_expert_only")


def test_compat_answer_for_the_installed_versions(capsys: pytest.CaptureFixture[str]) -> None:
    """`check --json` carries the compatibility table's verdict for what is installed here."""
    from sglang_overlap.compat import evaluate

    rc, out = _check(capsys, "--assume-arch", "sm90")
    c = out["compat"]
    s = c["stack"]
    assert s["arch"] == "sm90" and s["sglang"] == "0.5.23"
    assert s["deep_gemm"] == out["kernels"]["deep_gemm"]["version"]
    assert s["deep_ep"] == out["kernels"]["deep_ep"]["version"]
    from sglang_overlap.compat import Stack

    expected = evaluate(Stack(**{**s, "deep_ep_forms": tuple(s["deep_ep_forms"])})).to_dict()
    assert c["matched"] == expected["matched"] and c["fast_path"] == "sm90-patched-deepgemm"
    patched = out["kernels"]["plugin_patched_deepgemm"]["available"]
    assert c["fast_path_serves"] == (expected["fast_path_serves"] and patched)
    if not c["fast_path_serves"]:
        assert c["missing"] and all(m["fix"] for m in c["missing"])


def test_compat_answer_for_a_blackwell_box(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "sm100")
    c = out["compat"]
    assert c["stack"]["arch"] == "sm100" and c["fast_path"] == "sm100"
    has_form = "per-expert" in out["kernels"]["deep_ep"]["low_latency_combine_overlap"]
    assert c["fast_path_serves"] == has_form
    assert ("sm100" in c["matched"]) == has_form and "any-torch-a2a" in c["matched"]
