"""OverlapSettings: flags generated from the dataclass, and validation messages that name flags."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from sglang_overlap.settings import (
    OverlapSettings,
    ServerFacts,
    SettingsError,
    add_arguments,
    flag_name,
    upstream_fields,
    validate_settings,
)

DEEPEP = ServerFacts(moe_a2a_backend="deepep", tp_size=16)


def _parse(argv: list[str]) -> OverlapSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser, include_upstream=True)
    return OverlapSettings.from_mapping(vars(parser.parse_args(argv)))


def test_every_field_has_help_and_a_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, include_upstream=True)
    for f in dataclasses.fields(OverlapSettings):
        action = parser._option_string_actions[flag_name(f.name)]
        assert action.help and len(action.help) > 30, f.name
        assert action.default == f.default, f.name


def test_upstream_names_are_sglangs() -> None:
    assert {flag_name(f.name) for f in upstream_fields()} == {
        "--enable-two-batch-overlap",
        "--enable-single-batch-overlap",
        "--tbo-token-distribution-threshold",
        "--moe-a2a-backend",
    }


def test_defaults_are_upstream_behaviour() -> None:
    s = _parse([])
    assert s == OverlapSettings()
    assert not s.any_overlap and s.overlap_gating == "always"
    assert validate_settings(s, ServerFacts()) == []


def test_parse_all_flags() -> None:
    s = _parse([
        "--enable-single-batch-overlap", "--overlap-gating", "auto", "--sbo-combine-num-sms", "8",
        "--sbo-signal-granularity", "block", "--sbo-down-gemm-overlap", "force",
        "--overlap-hardware-profile", "H20", "--tbo-token-distribution-threshold", "0.3",
    ])
    assert s.enable_single_batch_overlap and s.overlap_gating == "auto"
    assert (s.sbo_combine_num_sms, s.sbo_signal_granularity) == (8, "block")
    assert s.sbo_down_gemm_overlap == "force" and s.overlap_hardware_profile == "H20"
    assert s.tbo_token_distribution_threshold == 0.3
    assert validate_settings(s, DEEPEP) == []


def test_choices_come_from_literals() -> None:
    with pytest.raises(SystemExit):
        _parse(["--overlap-gating", "sometimes"])
    with pytest.raises(SystemExit):
        _parse(["--sbo-signal-granularity", "tile"])


def test_add_arguments_twice_is_harmless() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    add_arguments(parser)
    assert parser.parse_args(["--overlap-gating", "auto"]).overlap_gating == "auto"


@pytest.mark.parametrize(
    ("changes", "deploy", "needle"),
    [
        ({"tbo_token_distribution_threshold": 0.7}, DEEPEP, "--tbo-token-distribution-threshold"),
        ({"tbo_token_distribution_threshold": -0.1}, DEEPEP, "got -0.1"),
        ({"enable_single_batch_overlap": True}, ServerFacts(), "--moe-a2a-backend deepep"),
        ({"enable_two_batch_overlap": True}, ServerFacts(), "--enable-two-batch-overlap needs"),
        ({"overlap_gating_hysteresis": 0.9, "enable_two_batch_overlap": True}, DEEPEP,
         "--overlap-gating-hysteresis"),
        ({"sbo_combine_num_sms": -1, "enable_single_batch_overlap": True}, DEEPEP, ">= 0"),
        ({"sbo_down_gemm_overlap": "force"}, DEEPEP,
         "--sbo-down-gemm-overlap needs --enable-single-batch-overlap"),
        ({"enable_single_batch_overlap": True, "sbo_down_gemm_overlap": "off",
          "sbo_signal_granularity": "block"}, DEEPEP, "contradicts --sbo-down-gemm-overlap off"),
        ({"enable_single_batch_overlap": True, "sbo_down_gemm_overlap": "off",
          "sbo_combine_num_sms": 4}, DEEPEP, "--sbo-combine-num-sms contradicts"),
        ({"overlap_gating": "auto"}, DEEPEP, "--overlap-gating auto needs"),
        ({"overlap_hardware_profile": "A100"}, DEEPEP, "--overlap-hardware-profile"),
        ({"enable_two_batch_overlap": True}, ServerFacts(moe_a2a_backend="torch_a2a"),
         "torch_a2a needs --tp 2 or more"),
        ({"overlap_gating_explore": 0.6}, DEEPEP, "--overlap-gating-explore must be in [0, 0.5]"),
        ({"overlap_gating_trials": -1}, DEEPEP, "--overlap-gating-trials must be an integer"),
        ({"overlap_gating_sync_steps": 0}, DEEPEP, "--overlap-gating-sync-steps must be in"),
        ({"overlap_gating": "auto", "enable_two_batch_overlap": True,
          "overlap_hardware_profile": "/nonexistent/p.json"}, DEEPEP,
         "--overlap-hardware-profile /nonexistent/p.json: hardware profile file"),
    ],
)
def test_invalid_combinations_name_the_flags(
    changes: dict, deploy: ServerFacts, needle: str
) -> None:
    s = dataclasses.replace(OverlapSettings(), **changes)
    with pytest.raises(SettingsError) as info:
        validate_settings(s, deploy)
    assert needle in str(info.value), f"{changes=} {info.value=}"


def test_tbo_with_attention_dp_needs_no_a2a() -> None:
    s = OverlapSettings(enable_two_batch_overlap=True)
    assert validate_settings(s, ServerFacts(attn_dp_size=2)) == []


def test_tbo_and_sbo_together_warn() -> None:
    s = OverlapSettings(enable_two_batch_overlap=True, enable_single_batch_overlap=True)
    (warning,) = validate_settings(s, DEEPEP)
    assert "TBO steps run without SBO" in warning


def test_two_chunk_enabled() -> None:
    assert OverlapSettings(enable_two_batch_overlap=True).two_chunk_enabled
    assert not OverlapSettings(enable_two_batch_overlap=True,
                               tbo_token_distribution_threshold=0.0).two_chunk_enabled
    assert not OverlapSettings().two_chunk_enabled


@pytest.mark.parametrize("profile", ["H200-measured", "H20", "auto", "my-node.json"])
def test_every_shipped_hardware_profile_is_accepted(profile: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-node.json").write_text('{"base": "H200", "source": "calibrated here"}')
    s = OverlapSettings(enable_two_batch_overlap=True, overlap_gating="auto",
                        overlap_hardware_profile=profile)
    assert validate_settings(s, ServerFacts(moe_a2a_backend="deepep")) == []


def test_the_a2a_field_keeps_what_was_asked_under_sglangs_flag_name() -> None:
    s = _parse(["--moe-a2a-backend", "torch_a2a"])
    assert s.requested_a2a_backend == "torch_a2a"
    assert flag_name("requested_a2a_backend") == "--moe-a2a-backend"
    assert OverlapSettings.from_mapping(s.to_dests()) == s
