"""The one settings reader: defaults outside a server, the published record's settings inside
one (re-read when another record is published), the Engine API's environment flags, and no
error turned into "every mode off"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_module

require_module("sglang.srt.runtime_context")

from sglang.srt.runtime_context import create_context, use_context  # noqa: E402

from sglang_overlap.settings import OverlapSettings, SettingsError  # noqa: E402
from sglang_overlap.sglang import state  # noqa: E402
from sglang_overlap.sglang.upstream.server_args import parse_server_args  # noqa: E402


def _context(model: Path, *flags: str):  # noqa: ANN202
    server_args, settings = parse_server_args(["--model-path", str(model), "--device", "cpu",
                                               *flags])
    return create_context(server_args, role="scheduler"), settings


def test_outside_a_server_every_mode_is_off() -> None:
    assert state.settings() == OverlapSettings()
    assert not state.sbo_active() and not state.in_tbo()


def test_inside_a_server_the_published_record_is_read_and_followed(tiny_dsv3: Path) -> None:
    sbo, sbo_settings = _context(tiny_dsv3, "--tp", "2", "--enable-single-batch-overlap",
                                 "--moe-a2a-backend", "torch_a2a", "--sbo-combine-num-sms", "5")
    tbo, tbo_settings = _context(tiny_dsv3, "--tp", "2", "--enable-two-batch-overlap",
                                 "--moe-a2a-backend", "deepep", "--overlap-gating", "auto")
    with use_context(sbo):
        got = state.settings()
        assert got == sbo_settings and got.requested_a2a_backend == "torch_a2a"
        assert state.settings() is got  # kept while the record stays published
        assert state.sbo_active() and state.combine_num_sms() == 5
        with state.tbo_running():
            assert not state.sbo_active()
    with use_context(tbo):
        assert state.settings() == tbo_settings and tbo_settings.overlap_gating == "auto"
        assert state.combine_num_sms() == 3  # upstream's Hopper default (the nominal CPU GPU)


def test_a_real_error_is_not_turned_into_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt import runtime_context

    def broken() -> None:
        raise RuntimeError("context torn down")

    monkeypatch.setattr(runtime_context, "get_server_args", broken)
    with pytest.raises(RuntimeError, match="context torn down"):
        state.settings()


def test_engine_api_flags_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    class Record:  # a ServerArgs built by Engine(**kwargs): upstream fields, no plugin settings
        enable_single_batch_overlap = True
        moe_a2a_backend = "deepep"

    monkeypatch.setenv(state.ENV_ARGS, "--overlap-gating auto --sbo-signal-granularity expert")
    got = state.settings_of(Record())
    assert (got.enable_single_batch_overlap, got.requested_a2a_backend, got.overlap_gating,
            got.sbo_signal_granularity) == (True, "deepep", "auto", "expert")
    for raw, token in (("--overlap-gating sometimes", "'sometimes'"),
                       ("--enable-two-batch-overlap --sbo-bogus 3", "'--sbo-bogus'"),
                       ("--overlap-gating-trials", "--overlap-gating-trials"),
                       ("--overlap-gating 'auto", "No closing quotation")):
        monkeypatch.setenv(state.ENV_ARGS, raw)
        with pytest.raises(SettingsError) as err:
            state.settings_of(Record())
        assert "SGLANG_OVERLAP_ARGS" in str(err.value) and token in str(err.value), err.value
