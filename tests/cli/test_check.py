"""`sglang-overlap check` through the real CLI entry point, SGLang parser and installed wheels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_module

require_module("sglang")

from sglang_overlap.cli.main import main  # noqa: E402
from sglang_overlap.kernels.package_source import package_dir  # noqa: E402

HAS_TRITON = package_dir("triton") is not None
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here downloads a model's config.json: the answer is the same on any machine."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


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

    rc, out = _check(capsys, "--full")
    assert rc == 0 and out["ok"]
    assert out["machine"]["cpu_only"] == (not torch.cuda.is_available())
    assert out["machine"]["torch"] == torch.__version__ and out["machine"]["cuda"] == (
        torch.version.cuda)
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
    assert rc == 2 and not out["ok"]
    assert out["flags"]["errors"] == ["--sbo-down-gemm-overlap needs "
                                      "--enable-single-batch-overlap"], out["flags"]
    assert out["sbo"]["path"] is None and out["sbo"]["reason"].startswith("not evaluated")
    assert out["tbo"]["path"] is None


def test_tbo_path_is_described(capsys: pytest.CaptureFixture[str], model: list[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "sm90", "--enable-two-batch-overlap",
                     "--moe-a2a-backend", "deepep", "--tp", "2", *model)
    assert rc == 0, out
    assert out["tbo"]["path"].startswith("on (deepep; always)")
    assert "two-chunk at t=0.48" in out["tbo"]["path"]


def test_text_report_with_import_check(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from sglang_overlap.kernels.capabilities import nvidia_driver_present

    rc = main(["check", "--assume-arch", "sm90"])
    text = capsys.readouterr().out
    assert rc == 0 and "SBO: off" in text and "ready" in text
    assert "GPU (assumed): assumed SM90" in text
    if package_dir("deep_ep") is not None and not nvidia_driver_present():
        assert "deep_ep 0.1.2.post1: import not tried (no NVIDIA driver here)" in text
    elif package_dir("deep_ep") is not None and not torch.cuda.is_available():
        assert "deep_ep 0.1.2.post1: does not import (ImportError" in text


def test_rejected_server_flags_are_one_error_and_nothing_evaluated(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "sm90", "--model-path", "m",
                     "--enable-single-batch-overlap", "--moe-a2a-backend", "deepep",
                     "--no-such-sglang-flag")
    assert rc == 2 and out["flags"]["errors"] == [
        "unrecognized arguments: --no-such-sglang-flag (SGLang's parser)"], out["flags"]
    assert out["sbo"]["path"] is None and out["tbo"]["path"] is None


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


QUICK_START = ["--model-path", "deepseek-ai/DeepSeek-V3", "--tp", "16", "--moe-a2a-backend",
               "deepep", "--enable-two-batch-overlap", "--enable-single-batch-overlap",
               "--overlap-gating", "auto"]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_overlap", "check", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(("argv", "line"), [
    (["--overlap-gating-hysteresis", "-1"],
     "--overlap-gating-hysteresis must be in [0, 0.5] (got -1.0)"),
    (["--tp", "two"], "argument --tp-size/--tensor-parallel-size/--tp: invalid int value: 'two'"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag (SGLang's parser)"),
    ([], None),
])
def test_a_bad_flag_is_one_line_and_exit_2(argv: list[str], line: str | None) -> None:
    """No report, no SGLang usage text (500 lines): argparse's one line, on stderr."""
    if line is None:  # no --model-path, as `sglang serve` says it
        argv, line = ["--enable-two-batch-overlap"], ("the following arguments are required: "
                                                      "--model-path/--model")
    else:
        argv = ["--model-path", "/nonexistent/m", *argv]
    done = _cli(*argv)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == "" and done.stderr == f"sglang-overlap check: error: {line}\n", (
        done.stderr[-2000:])


def test_the_quick_start_check_imports_neither_sglang_nor_torch() -> None:
    """What makes `check` answer in about a second: the flags are the fast reader's, the GPU is
    asked of the CUDA driver through ctypes (tests/kernels/test_cuda_device.py runs it on a
    driver)."""
    code = ("import sys; from sglang_overlap.cli.main import main; "
            f"rc = main(['check', '--assume-arch', 'sm90', *{QUICK_START!r}]); "
            "heavy = [m for m in ('torch', 'sglang') if m in sys.modules]; "
            "assert not heavy, heavy; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "\nready\n" in done.stdout and "SBO: per_expert" in done.stdout


def test_rows_matched_are_those_of_the_backend_asked_for(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "sm90", *QUICK_START)
    assert "any-torch-a2a" not in out["compat"]["matched"] and out["compat"]["matched"]
    assert out["compat"]["backend"] == "deepep"
    rc, out = _check(capsys, "--assume-arch", "sm90", "--model-path", "m", "--tp", "2",
                     "--moe-a2a-backend", "torch_a2a", "--enable-two-batch-overlap")
    assert out["compat"]["matched"] == ["any-torch-a2a"], out["compat"]


def test_no_patched_deepgemm_producer_without_an_sm90_gpu(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(capsys, "--assume-arch", "cpu")
    patched = out["kernels"]["plugin_patched_deepgemm"]
    assert patched["available"] is False and "this machine: cpu" in patched["reason"]
    rc, out = _check(capsys, "--assume-arch", "sm100")
    assert out["kernels"]["plugin_patched_deepgemm"]["available"] is False


@pytest.mark.parametrize("argv", [
    QUICK_START,
    ["--model-path", "m", "--tp-size", "2", "--moe-a2a-backend", "torch_a2a",
     "--enable-single-batch-overlap", "--sbo-down-gemm-overlap", "off"],
    ["--model-path", "m", "--dp", "2", "--enable-dp-attention", "--enable-two-batch-overlap",
     "--tbo-token-distribution-threshold", "0"],
    ["--model-path", "m", "--tp", "1", "--moe-a2a-backend", "torch_a2a"],
    ["--model-path", "m", "--overlap-gating", "auto"],
    ["--model-path", "m", "--enable-single-batch-overlap", "--moe-a2a-backend", "deepep",
     "--sbo-signal-granularity", "block", "--deepep-mode", "low_latency"],
])
def test_the_fast_reader_answers_as_sglangs_parser(capsys: pytest.CaptureFixture[str],
                                                   argv: list[str]) -> None:
    """The same settings, warnings, errors and paths with or without SGLang's parser."""
    keys = ("sbo", "tbo", "ok")
    rc_fast, fast = _check(capsys, "--assume-arch", "sm90", *argv)
    rc_full, full = _check(capsys, "--assume-arch", "sm90", "--full", *argv)
    assert fast["flags"]["read_by"].startswith("the plugin's reader")
    assert full["flags"]["read_by"].startswith("SGLang's parser")
    assert rc_fast == rc_full, (fast["flags"], full["flags"])
    for key in ("settings", "warnings", "errors"):
        assert fast["flags"][key] == full["flags"][key], key
    assert {k: fast[k] for k in keys} == {k: full[k] for k in keys}


def test_the_fast_readers_flags_are_sglangs() -> None:
    """Each option string the fast reader knows means in SGLang's parser what it means there:
    the same dest, type, default, choices and action."""
    import argparse

    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    from sglang_overlap.cli.check_flags import SGLANG_SUBSET, fast_parser

    load_plugins()
    sglang = argparse.ArgumentParser()
    ServerArgs.add_cli_args(sglang)
    fast = fast_parser()
    for names, _ in SGLANG_SUBSET:
        ours = fast._option_string_actions[names[0]]
        for name in names:
            theirs = sglang._option_string_actions.get(name)
            if theirs is None:  # --tp, --dp: SGLang's argparse takes the unique prefix
                matches = [o for o in sglang._option_string_actions if o.startswith(name)]
                assert len(matches) == 1, (name, matches)
                theirs = sglang._option_string_actions[matches[0]]
            assert (ours.dest, ours.type, ours.default, ours.nargs, ours.const, ours.required) == (
                theirs.dest, theirs.type, theirs.default, theirs.nargs, theirs.const,
                theirs.required), name
            assert (ours.choices is None) == (theirs.choices is None), name
            if ours.choices is not None:
                assert list(ours.choices) == list(theirs.choices), name


def test_check_names_the_sbo_producer_and_the_triton_it_judged(
        capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_overlap.kernels.triton_versions import installed_triton

    rc, out = _check(capsys, "--assume-arch", "sm90", *QUICK_START)
    k = out["kernels"]
    assert k["triton_version"] == installed_triton()
    assert k["sbo_producer"]["fused_triton"] is None and k["sbo_producer"]["sliced"] is None
    patched = k["plugin_patched_deepgemm"]
    first = "the patched DeepGEMM kernel;" if patched["available"] else "the fused Triton kernel"
    assert k["sbo_producer"]["serves"].startswith(first), k["sbo_producer"]


def test_a_triton_that_cannot_build_the_producers_is_named_with_the_fix(tmp_path: Path) -> None:
    """A triton release the table refuses (3.3.1: the kernels' names are not found), put first
    on the path: no down-GEMM overlap, and the report names the release and what to install."""
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("")
    (tmp_path / "triton-3.3.1.dist-info").mkdir()
    (tmp_path / "triton-3.3.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: triton\nVersion: 3.3.1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "sglang_overlap", "check", "--assume-arch",
                           "sm90", "--no-import-check", *QUICK_START], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    text = done.stdout
    assert "SBO down-GEMM producer (triton 3.3.1): none: the sliced SBO producer's" in text, text
    (sbo,) = [line for line in text.splitlines() if line.startswith("SBO: ")]
    assert sbo.startswith("SBO: shared_expert_only:") and "does not build on triton 3.3.1" in sbo
    assert "pip install triton==3.8.0" in sbo, sbo
    assert "plugin signal GEMM (triton): no" in text, text
    assert "fast path (sm90-patched-deepgemm): will NOT serve" in text, text
    assert "missing triton 3.4.0 or later (the plugin's Triton signal GEMM)" in text, text
