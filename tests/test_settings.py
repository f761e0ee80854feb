"""OverlapSettings: flags generated from the dataclass, and validation messages that name flags."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from sglang_overlap.settings import (
    HARDWARE_PROFILE_CHOICES,
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
        # one rank: SGLang's TBO operations skip the dispatch at EP 1 (seen on one H100)
        ({"enable_two_batch_overlap": True}, ServerFacts(moe_a2a_backend="deepep"),
         "needs the experts on 2 or more ranks (--tp 2 or more, got --tp 1)"),
        ({"enable_two_batch_overlap": True, "enable_single_batch_overlap": True,
          "overlap_gating": "auto"}, ServerFacts(moe_a2a_backend="deepep", attn_dp_size=1),
         "on one GPU only --enable-single-batch-overlap serves"),
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
    assert validate_settings(s, ServerFacts(moe_a2a_backend="deepep", tp_size=2)) == []


def test_the_a2a_field_keeps_what_was_asked_under_sglangs_flag_name() -> None:
    s = _parse(["--moe-a2a-backend", "torch_a2a"])
    assert s.requested_a2a_backend == "torch_a2a"
    assert flag_name("requested_a2a_backend") == "--moe-a2a-backend"
    assert OverlapSettings.from_mapping(s.to_dests()) == s


# -- contracts the mutation run showed unchecked ---------------------------------------------

def _errors(s: OverlapSettings, facts: ServerFacts = DEEPEP) -> list[str]:
    """The error clauses of a refused `s`, each checked to name its flag first."""
    with pytest.raises(SettingsError) as info:
        validate_settings(s, facts)
    msg = str(info.value)
    assert msg.startswith("sglang-overlap: --"), msg
    clauses = msg.removeprefix("sglang-overlap: ").split("; ")
    for clause in clauses:
        flag = clause.split()[0]
        assert re.fullmatch(r"--[a-z0-9-]+", flag) and "XX" not in clause, clause
    return clauses


def test_flag_name_takes_a_field_or_a_dest() -> None:
    assert flag_name("requested_a2a_backend") == flag_name("moe_a2a_backend") == (
        "--moe-a2a-backend")
    assert flag_name("overlap_gating") == "--overlap-gating"


def test_the_plugin_parser_adds_only_its_own_flags_under_its_own_group() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert "--enable-two-batch-overlap" not in parser._option_string_actions  # SGLang's
    group = next(g for g in parser._action_groups if g.title == "sglang-overlap")
    assert group.description == "MoE communication/computation overlap (plugin sglang-overlap)"
    ours = {a.option_strings[0] for a in group._group_actions}
    want = {flag_name(f.name) for f in dataclasses.fields(OverlapSettings)
            if not f.metadata["upstream"]}
    assert ours == want
    for action in group._group_actions:
        f = next(f for f in dataclasses.fields(OverlapSettings)
                 if flag_name(f.name) == action.option_strings[0])
        if f.type not in ("bool", bool):
            assert action.metavar == f.metadata["metavar"], f.name


def test_a_flag_already_there_is_skipped_not_the_rest() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--enable-two-batch-overlap", action="store_true")
    add_arguments(parser, include_upstream=True)
    for f in dataclasses.fields(OverlapSettings):
        assert flag_name(f.name) in parser._option_string_actions, f.name


def test_without_defaults_a_flag_not_given_is_absent() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, include_upstream=True, defaults=False)
    assert vars(parser.parse_args([])) == {}
    got = vars(parser.parse_args(["--enable-single-batch-overlap", "--overlap-gating", "auto"]))
    assert got == {"enable_single_batch_overlap": True, "overlap_gating": "auto"}


@pytest.mark.parametrize(("steps", "ok"), [(0, False), (1, True), (4096, True), (4097, False)])
def test_sync_steps_bounds_are_inclusive(steps: int, ok: bool) -> None:
    s = OverlapSettings(enable_two_batch_overlap=True, overlap_gating_sync_steps=steps)
    if ok:
        assert validate_settings(s, DEEPEP) == []
    else:
        assert _errors(s) == [f"--overlap-gating-sync-steps must be in [1, 4096] (got {steps})"]


def test_a_bad_profile_lists_every_choice() -> None:
    (clause,) = _errors(OverlapSettings(overlap_hardware_profile="A100"))
    assert f"one of {', '.join(HARDWARE_PROFILE_CHOICES)} or a path" in clause


@pytest.mark.parametrize(("backend", "tp", "ok"), [
    ("torch_a2a", 1, False), ("torch_a2a", 2, True), ("deepep", 1, True), ("", 8, False),
])
def test_a2a_backend_facts(backend: str, tp: int, ok: bool) -> None:
    s = OverlapSettings(enable_single_batch_overlap=True)
    facts = ServerFacts(moe_a2a_backend=backend, tp_size=tp)
    if ok:
        assert validate_settings(s, facts) == []
    else:
        assert _errors(s, facts)


@pytest.mark.parametrize(("changes", "flag"), [
    ({"sbo_signal_granularity": "block"}, "--sbo-signal-granularity"),
    ({"sbo_combine_num_sms": 4}, "--sbo-combine-num-sms"),
    ({"sbo_down_gemm_overlap": "off"}, "--sbo-down-gemm-overlap"),
])
def test_sbo_knobs_need_sbo(changes: dict, flag: str) -> None:
    s = dataclasses.replace(OverlapSettings(), **changes)
    assert f"{flag} needs --enable-single-batch-overlap" in _errors(s)


def test_sbo_off_accepts_auto_granularity_and_refuses_any_combine_sms() -> None:
    s = OverlapSettings(enable_single_batch_overlap=True, sbo_down_gemm_overlap="off")
    assert validate_settings(s, DEEPEP) == []
    (clause,) = _errors(dataclasses.replace(s, sbo_combine_num_sms=1))
    assert clause == ("--sbo-combine-num-sms contradicts --sbo-down-gemm-overlap off "
                      "(combine-send gets its own SMs only while the down GEMM runs)")


def test_every_error_is_reported_at_once() -> None:
    s = OverlapSettings(overlap_gating="auto", overlap_gating_sync_steps=0)
    assert _errors(s) == [
        "--overlap-gating-sync-steps must be in [1, 4096] (got 0)",
        "--overlap-gating auto needs at least one of --enable-two-batch-overlap, "
        "--enable-single-batch-overlap",
    ]


def test_the_tbo_sbo_warning_and_the_a2a_errors_read_in_full() -> None:
    s = OverlapSettings(enable_two_batch_overlap=True, enable_single_batch_overlap=True)
    assert validate_settings(s, DEEPEP) == [
        "--enable-single-batch-overlap with --enable-two-batch-overlap and --overlap-gating "
        "always: TBO steps run without SBO (as upstream); SBO applies to steps TBO skips"]
    assert _errors(s, ServerFacts()) == [
        "--enable-single-batch-overlap needs an expert-parallel all-to-all backend: "
        "--moe-a2a-backend deepep or torch_a2a (got none)",
        "--enable-two-batch-overlap needs --moe-a2a-backend deepep or torch_a2a, or attention "
        "data parallelism (got --moe-a2a-backend none, --attn-dp-size 1)"]
    assert _errors(OverlapSettings(enable_two_batch_overlap=True),
                   ServerFacts(moe_a2a_backend="torch_a2a")) == [
        "--moe-a2a-backend torch_a2a needs --tp 2 or more (experts are spread over the "
        "tensor-parallel ranks, got --tp 1)"]


@pytest.mark.parametrize(("kwargs", "want"), [
    ({}, set()),
    ({"enable_two_batch_overlap": True, "tbo_token_distribution_threshold": 0.0}, {"tbo"}),
    ({"enable_two_batch_overlap": True}, {"tbo", "two_chunk"}),  # SGLang's threshold 0.48
    ({"tbo_token_distribution_threshold": 0.48}, set()),  # two-chunk is a TBO split
    ({"enable_single_batch_overlap": True}, {"sbo"}),
])
def test_the_flags_turn_on_their_modes(kwargs: dict[str, object], want: set[str]) -> None:
    assert OverlapSettings(**kwargs).enabled_modes == want


def test_tbo_on_two_ranks_and_sbo_on_one_pass() -> None:
    """The one-rank refusal is TBO's alone: SBO serves on one rank, TBO from --tp 2."""
    tbo = OverlapSettings(enable_two_batch_overlap=True)
    assert validate_settings(tbo, ServerFacts(moe_a2a_backend="deepep", tp_size=2)) == []
    sbo = OverlapSettings(enable_single_batch_overlap=True)
    assert validate_settings(sbo, ServerFacts(moe_a2a_backend="deepep", tp_size=1)) == []
