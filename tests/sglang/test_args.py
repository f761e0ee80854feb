"""The plugin's flags on SGLang 0.5.23's real parser, carried to workers on the pickled record."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_module

require_module("sglang.srt.server_args")

from sglang_overlap.settings import OverlapSettings, SettingsError  # noqa: E402
from sglang_overlap.sglang.state import SETTINGS_ATTR, settings_of  # noqa: E402
from sglang_overlap.sglang.upstream.server_args import parse_server_args  # noqa: E402

MODEL = ["--model-path", "/nonexistent/tiny-dsv3"]


def test_serve_argv_with_plugin_flags_parses_and_survives_pickling() -> None:
    server_args, settings = parse_server_args([
        *MODEL, "--enable-single-batch-overlap", "--moe-a2a-backend", "deepep",
        "--overlap-gating", "auto", "--sbo-signal-granularity", "expert",
        "--sbo-combine-num-sms", "4", "--overlap-hardware-profile", "H20",
    ])
    assert settings.enable_single_batch_overlap and settings.overlap_gating == "auto"
    assert server_args.enable_single_batch_overlap  # SGLang's own field, same meaning
    # Scheduler subprocesses receive a pickled ServerArgs (multiprocessing spawn).
    clone = pickle.loads(pickle.dumps(server_args))
    assert settings_of(clone) == settings
    assert getattr(clone, SETTINGS_ATTR).sbo_combine_num_sms == 4
    assert clone.moe_a2a_backend == "deepep"


def test_no_plugin_flags_means_upstream_defaults() -> None:
    server_args, settings = parse_server_args(MODEL)
    assert settings == OverlapSettings()
    assert not server_args.enable_two_batch_overlap


def test_upstream_threshold_flag_is_read() -> None:
    _, settings = parse_server_args([
        *MODEL, "--enable-two-batch-overlap", "--moe-a2a-backend", "deepep", "--tp", "2",
        "--tbo-token-distribution-threshold", "0",
    ])
    assert settings.enable_two_batch_overlap and not settings.two_chunk_enabled


def test_plugin_a2a_backend_is_a_parser_choice() -> None:
    server_args, settings = parse_server_args([
        *MODEL, "--tp", "2", "--enable-two-batch-overlap", "--moe-a2a-backend", "torch_a2a",
    ])
    assert settings.enable_two_batch_overlap
    assert server_args.moe_a2a_backend == "torch_a2a"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--enable-single-batch-overlap"], "--moe-a2a-backend deepep or torch_a2a (got none)"),
        (["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep",
          "--tbo-token-distribution-threshold", "0.75"], "in [0, 0.5] (got 0.75)"),
        (["--overlap-gating", "auto"], "--overlap-gating auto needs"),
        (["--sbo-down-gemm-overlap", "force"], "needs --enable-single-batch-overlap"),
        (["--moe-a2a-backend", "torch_a2a", "--enable-two-batch-overlap"],
         "torch_a2a needs --tp 2 or more (experts are spread over the tensor-parallel ranks, "
         "got --tp 1)"),
    ],
)
def test_invalid_flags_never_reach_serving(argv: list[str], needle: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_server_args([*MODEL, *argv])
    assert needle in str(info.value)


def test_bad_choice_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_server_args([*MODEL, "--sbo-signal-granularity", "tile"])
    assert "--sbo-signal-granularity" in capsys.readouterr().err


def test_registering_twice_is_harmless() -> None:
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_overlap.plugin import register

    load_plugins()
    before = {k: len(v) for k, v in HookRegistry._hooks.items()}
    register()
    register()
    assert {k: len(v) for k, v in HookRegistry._hooks.items()} == before
    _, settings = parse_server_args([*MODEL, "--overlap-hardware-profile", "H200"])
    assert settings.overlap_hardware_profile == "H200"


def test_engine_api_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.server_args import ServerArgs

    record = ServerArgs(model_path="/nonexistent", enable_two_batch_overlap=True)
    monkeypatch.setenv("SGLANG_OVERLAP_ARGS",
                       "--overlap-gating auto --overlap-hardware-profile H20")
    settings = settings_of(record)
    assert settings.enable_two_batch_overlap and settings.overlap_gating == "auto"
    assert settings.overlap_hardware_profile == "H20"
    assert settings.tbo_token_distribution_threshold == 0.48


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
        timeout=240,
    )


PARSE = (
    "import sys\n"
    "from sglang.srt.plugins import load_plugins\n"
    "from sglang.srt.server_args import prepare_server_args\n"
    "load_plugins()\n"
    "sa = prepare_server_args(sys.argv[1:] or {argv!r})\n"
    "print('SETTINGS', getattr(sa, '_sglang_overlap', None))\n"
)


def test_sglang_plugins_whitelist_without_us_disables_the_plugin_cleanly() -> None:
    env = {"SGLANG_PLUGINS": "cpu_shim"}
    off = _run(PARSE.format(argv=[*MODEL, "--overlap-gating", "auto"]), env)
    assert off.returncode == 2 and "unrecognized arguments: --overlap-gating" in off.stderr
    upstream = _run(PARSE.format(argv=[*MODEL, "--enable-two-batch-overlap",
                                       "--moe-a2a-backend", "deepep"]), env)
    assert upstream.returncode == 0, upstream.stderr[-2000:]
    assert "SETTINGS None" in upstream.stdout
    on = _run(PARSE.format(argv=[*MODEL, "--overlap-gating", "always"]),
              {"SGLANG_PLUGINS": "cpu_shim,sglang_overlap"})
    assert on.returncode == 0 and "overlap_gating='always'" in on.stdout, on.stderr[-2000:]


def test_launch_server_help_lists_plugin_flags() -> None:
    # `python -m sglang.launch_server` loads plugins before parsing; `sglang serve --help` does
    # not (see `sglang-overlap args`).
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag in ("--overlap-gating", "--sbo-down-gemm-overlap", "--overlap-hardware-profile"):
        assert flag in proc.stdout


def test_forced_sbo_path_the_kernels_lack_is_refused_at_parse(monkeypatch) -> None:
    # On a Hopper description with the installed wheels (sgl-deep-ep 0.1.2.post1 has only the
    # per-expert combine form), forcing per-block signals cannot work: refused before serving.
    monkeypatch.setenv("SGLANG_OVERLAP_ASSUME_ARCH", "sm90")
    with pytest.raises(SettingsError) as info:
        parse_server_args([*MODEL, "--enable-single-batch-overlap", "--moe-a2a-backend",
                           "deepep", "--sbo-down-gemm-overlap", "force",
                           "--sbo-signal-granularity", "block"])
    assert "deep_ep" in str(info.value) or "deep-ep" in str(info.value), str(info.value)
    _, settings = parse_server_args([*MODEL, "--enable-single-batch-overlap",
                                     "--moe-a2a-backend", "deepep"])
    assert settings.sbo_down_gemm_overlap == "auto"


def test_engine_runs_the_command_lines_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Engine(**kwargs)` with $SGLANG_OVERLAP_ARGS: a bad value stops it with the very
    SettingsError the command line gives (one validation, `server_args.check_settings`)."""
    from sglang.srt.entrypoints.engine import Engine

    bad = ["--overlap-gating-hysteresis", "-1"]
    with pytest.raises(SettingsError) as cli:
        parse_server_args([*MODEL, *bad])
    assert "--overlap-gating-hysteresis must be in [0, 0.5] (got -1.0)" in str(cli.value)
    monkeypatch.setenv("SGLANG_OVERLAP_ARGS", " ".join(bad))
    with pytest.raises(SettingsError) as engine:
        Engine(model_path=MODEL[1])
    assert str(engine.value) == str(cli.value)


def test_engine_with_good_settings_carries_them_on_the_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the Engine path validated rides on the record to the scheduler processes."""
    from sglang.srt.server_args import ServerArgs

    from sglang_overlap.sglang.upstream.server_args import _before_resolve_once

    monkeypatch.setenv("SGLANG_OVERLAP_ARGS", "--overlap-gating-hysteresis 0.1")
    record = ServerArgs(model_path=MODEL[1], enable_two_batch_overlap=True,
                        moe_a2a_backend="deepep", tp_size=2)
    _before_resolve_once(record)
    monkeypatch.delenv("SGLANG_OVERLAP_ARGS")
    carried = pickle.loads(pickle.dumps(record))
    assert getattr(carried, SETTINGS_ATTR).overlap_gating_hysteresis == 0.1
    assert settings_of(carried).enable_two_batch_overlap


@pytest.mark.parametrize("case", ["bad value", "unproven model"])
def test_sglang_serve_refusal_ends_in_one_argparse_line(tmp_path: Path, case: str) -> None:
    """`sglang serve` stops as argparse does on a bad value or a mode not proven on the model:
    one `error:` line, exit 2, before any process starts."""
    if case == "bad value":
        argv = [*MODEL, "--overlap-gating-hysteresis", "2"]
        want = "--overlap-gating-hysteresis must be in [0, 0.5] (got 2.0)"
    else:
        argv = ["--model-path", str(_config_dir(tmp_path, "Qwen3MoeForCausalLM")),
                "--enable-single-batch-overlap", "--moe-a2a-backend", "deepep"]
        want = "--enable-single-batch-overlap (SBO) is not supported on Qwen3MoeForCausalLM ("
    done = subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv],
                          capture_output=True, text=True, timeout=240, env=os.environ.copy())
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"sglang serve: error: sglang-overlap: {want}"), done.stderr[-3000:]


def _config_dir(tmp_path: Path, architecture: str) -> Path:
    """A model directory with only a config.json (what the launcher reads before start-up)."""
    import json

    from transformers import DeepseekV2Config, MixtralConfig, Qwen3MoeConfig

    cls = {"Qwen3MoeForCausalLM": Qwen3MoeConfig, "DeepseekV2ForCausalLM": DeepseekV2Config,
           "MixtralForCausalLM": MixtralConfig}
    config = cls[architecture](num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                               num_key_value_heads=4, vocab_size=256).to_dict()
    if architecture == "DeepseekV2ForCausalLM":  # the MoE fields transformers leaves unset
        config.update(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      n_shared_experts=1, first_k_dense_replace=1)
    config["architectures"] = [architecture]
    out = tmp_path / architecture
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("architecture", ["Qwen3MoeForCausalLM", "MixtralForCausalLM"])
@pytest.mark.parametrize(("flags", "named"), [
    (["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep", "--tp", "2"],
     "--enable-two-batch-overlap (TBO), two-chunk"),
    (["--enable-single-batch-overlap", "--moe-a2a-backend", "torch_a2a", "--tp", "2"],
     "--enable-single-batch-overlap (SBO), --moe-a2a-backend torch_a2a"),
])
def test_an_unproven_model_is_refused_at_argument_parsing(
        tmp_path: Path, architecture: str, flags: list[str], named: str) -> None:
    model = _config_dir(tmp_path, architecture)
    with pytest.raises(SettingsError) as info:
        parse_server_args(["--model-path", str(model), *flags])
    assert f"{named}" in str(info.value) and f"not supported on {architecture}" in str(info.value)
    _, settings = parse_server_args(["--model-path", str(model)])  # no overlap: plain SGLang
    assert not settings.any_overlap


def test_a_proven_model_is_served_in_every_mode(tmp_path: Path) -> None:
    model = _config_dir(tmp_path, "DeepseekV2ForCausalLM")
    _, settings = parse_server_args(["--model-path", str(model), "--tp", "2", "--moe-a2a-backend",
                                     "torch_a2a", "--enable-two-batch-overlap",
                                     "--enable-single-batch-overlap", "--overlap-gating", "auto"])
    assert settings.enable_two_batch_overlap and settings.overlap_gating == "auto"


def test_an_unproven_model_is_refused_when_sglang_builds_its_config(tmp_path: Path) -> None:
    """Where the launcher could not read config.json (a model not downloaded yet), SGLang's
    own ModelConfig.from_server_args stops the start, before any weight loads."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    from sglang_overlap.sglang.hooks import load_through_sglang

    load_through_sglang()
    model = _config_dir(tmp_path, "Qwen3MoeForCausalLM")
    record = ServerArgs(model_path=str(model), enable_two_batch_overlap=True,
                        moe_a2a_backend="deepep", device="cpu")
    setattr(record, SETTINGS_ATTR, settings_of(record))  # as if checked without the config
    with pytest.raises(SettingsError) as info:
        ModelConfig.from_server_args(record)
    assert "--enable-two-batch-overlap (TBO)" in str(info.value)
    assert "not supported on Qwen3MoeForCausalLM" in str(info.value)
    plain = ServerArgs(model_path=str(model), device="cpu")
    assert ModelConfig.from_server_args(plain).hf_config.architectures == [
        "Qwen3MoeForCausalLM"]
