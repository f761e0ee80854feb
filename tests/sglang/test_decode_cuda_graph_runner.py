"""`sglang/decode_cuda_graph_runner.py` on SGLang 0.5.23's real `DecodeCudaGraphRunner` methods
(CPU, no capture backend): with the mode selector every decode step in the captured range is
eligible for a graph of its own mode, keyed by mode; the capture runs each shape once per mode
under SGLang's own TBO/SBO switches; a step that still runs eager is counted with its reason."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("sglang.srt.model_executor.runner.decode_cuda_graph_runner",
                    reason="sglang 0.5.23 is not installed")

from sglang.srt.layers.attention.cutedsl_mla_backend import CuteDslMLABackend  # noqa: E402
from sglang.srt.layers.attention.flashinfer_mla_backend import (  # noqa: E402
    FlashInferMLAAttnBackend,
)
from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend  # noqa: E402
from sglang.srt.layers.attention.tbo_backend import TboAttnBackend  # noqa: E402
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend  # noqa: E402
from sglang.srt.layers.moe.utils import is_sbo_enabled, is_tbo_enabled  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (  # noqa: E402
    DecodeCudaGraphRunner,
)
from sglang.srt.runtime_context import get_flags  # noqa: E402

from sglang_overlap import stats
from sglang_overlap.modes import Mode, Phase, StepDecision  # noqa: E402
from sglang_overlap.settings import OverlapSettings, SettingsError  # noqa: E402
from sglang_overlap.sglang import state  # noqa: E402
from sglang_overlap.sglang.upstream import decode_cuda_graph_runner as glue  # noqa: E402

BOTH = OverlapSettings(enable_two_batch_overlap=True, enable_single_batch_overlap=True,
                       requested_a2a_backend="torch_a2a", overlap_gating="auto")
TBO_ONLY = OverlapSettings(enable_two_batch_overlap=True, overlap_gating="auto")
FIXED_TBO = OverlapSettings(enable_two_batch_overlap=True)


@pytest.fixture(scope="module", autouse=True)
def _plugins_loaded() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()


@pytest.fixture()
def settings(request: Any) -> Any:
    value = getattr(request, "param", BOTH)
    state.configure(value)
    moe = get_flags().moe
    saved = moe.tbo_enabled, moe.sbo_enabled
    moe.tbo_enabled = value.enable_two_batch_overlap
    moe.sbo_enabled = value.enable_single_batch_overlap
    yield value
    moe.tbo_enabled, moe.sbo_enabled = saved
    state.configure(None)


def _d(mode: str) -> StepDecision:
    """A decision for a decode step in `mode`."""
    return StepDecision(Mode(mode), Phase.DECODE)


def _runner(*, tbo: bool = True, max_bs: int = 8, draft: bool = False,
            attn_backend: Any = None) -> Any:
    """A DecodeCudaGraphRunner with what `can_run_graph` / `_make_graph_key` read (no capture)."""
    r = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    r.ragged_verify_mode = False
    r.captured_req_width = 1
    r.require_mlp_tp_gather = False
    r.require_mlp_sync = False
    r.enable_pdmux = False
    r.record_nolora_graph = False
    r.disable_padding = False
    r.max_bs = max_bs
    r.is_encoder_decoder = False
    r.enable_two_batch_overlap = tbo
    r.model_runner = SimpleNamespace(is_draft_worker=draft,
                                     spec_algorithm=SimpleNamespace(is_ngram=lambda: False))
    r.attn_backend = attn_backend if attn_backend is not None else _bare(TritonAttnBackend)
    return r


def _bare(cls: type) -> Any:
    """An instance of SGLang's backend class `cls` without its GPU set-up (its type is read)."""
    return cls.__new__(cls)


def _batch(bs: int, *, tbo_split: int | None = None, embeds: Any = None) -> Any:
    return SimpleNamespace(replace_embeds=embeds, spec_info=None, batch_size=bs,
                           can_run_tbo=tbo_split is not None, forward_mode=ForwardMode.DECODE,
                           lora_ids=None, can_run_decode_cuda_graph=True)


def _fallbacks() -> dict[tuple[str, ...], int]:
    return dict(stats.snapshot()["eager_fallbacks"])


def test_graph_modes_follow_the_flags() -> None:
    assert glue.graph_modes(BOTH) == ("tbo", "sbo", "none")
    assert glue.graph_modes(TBO_ONLY) == ("tbo", "none")
    assert glue.graph_modes(FIXED_TBO) == ()  # no selector: upstream's single set
    assert glue.graph_modes(OverlapSettings(overlap_gating="auto")) == ()


@pytest.mark.parametrize("settings", [FIXED_TBO], indirect=True)
def test_without_the_selector_upstream_decides_alone(settings: Any) -> None:
    r = _runner()
    assert not DecodeCudaGraphRunner.can_run_graph(r, _batch(4))  # TBO graphs only, as upstream
    assert DecodeCudaGraphRunner.can_run_graph(r, _batch(4, tbo_split=2))
    assert DecodeCudaGraphRunner._make_graph_key(r, 4).variant_label is None


def test_a_step_gated_off_tbo_replays_its_own_graph(settings: Any) -> None:
    r = _runner()
    before = _fallbacks()
    seen: dict[str, Any] = {}

    def orig(runner: Any, fb: Any) -> str:
        seen["tbo"] = runner.enable_two_batch_overlap  # load_batch's replay_prepare switch
        seen["key"] = DecodeCudaGraphRunner._make_graph_key(runner, 4)
        return "out"

    for mode, batch, want in (("none", _batch(4), "overlap:none"),
                              ("sbo", _batch(4), "overlap:sbo"),
                              ("tbo", _batch(4, tbo_split=2), "overlap:tbo")):
        with state.step(_d(mode)):
            assert DecodeCudaGraphRunner.can_run_graph(r, batch), mode
            assert glue.execute(orig, r, batch) == "out"
        assert seen["key"].variant_label == want and seen["key"].size == 4
        assert seen["tbo"] is (mode == "tbo"), mode
        assert r.enable_two_batch_overlap is True  # restored
    assert _fallbacks() == before


def test_eager_steps_in_the_range_are_counted_with_their_reason(settings: Any) -> None:
    r = _runner(max_bs=8)
    before = _fallbacks()
    with state.step(_d("none")):
        assert not DecodeCudaGraphRunner.can_run_graph(r, _batch(4, embeds=object()))
        assert not DecodeCudaGraphRunner.can_run_graph(r, _batch(16))  # above the range: not one
    after = _fallbacks()
    key = ("none", "embedding_override")
    assert after.get(key, 0) == before.get(key, 0) + 1
    assert sum(after.values()) == sum(before.values()) + 1


def test_a_draft_models_runner_keeps_upstreams_set(settings: Any) -> None:
    r = _runner(draft=True)
    with state.step(_d("none")):
        assert not DecodeCudaGraphRunner.can_run_graph(r, _batch(4))
        assert DecodeCudaGraphRunner._make_graph_key(r, 4).variant_label is None


def test_capture_runs_each_shape_once_per_mode_under_sglangs_switches(settings: Any) -> None:
    r = _runner()
    runs: list[tuple[Any, ...]] = []

    def orig(runner: Any, size: int, forward: Any) -> None:
        key = DecodeCudaGraphRunner._make_graph_key(runner, size)
        d = state.decision()
        runs.append((key.variant_label, is_tbo_enabled(), is_sbo_enabled(), d.mode, d.source,
                     state.sbo_active()))

    outer = _d("sbo")
    with state.step(outer):
        glue.capture_one_shape(orig, r, 8, None)
        assert (is_tbo_enabled(), is_sbo_enabled(), state.decision()) == (True, True, outer)
    assert runs == [("overlap:tbo", True, True, "tbo", "capture", False),  # TBO runs no SBO
                    ("overlap:sbo", False, True, "sbo", "capture", True),
                    ("overlap:none", False, False, "none", "capture", False)]
    assert DecodeCudaGraphRunner._make_graph_key(r, 8).variant_label is None  # outside a step


def test_asked_outside_a_step_the_batch_gets_sglangs_own_rule(settings: Any) -> None:
    """A speculative worker may ask the target's runner outside the target's forward: the
    batch's split picks TBO, else SBO (on in these settings)."""
    r = _runner()
    labels: list[str] = []

    def orig(runner: Any, fb: Any) -> str:
        labels.append(DecodeCudaGraphRunner._make_graph_key(runner, 4).variant_label)
        return "out"

    assert state.decision() is None
    glue.execute(orig, r, _batch(4, tbo_split=2))
    glue.execute(orig, r, _batch(4))
    assert labels == ["overlap:tbo", "overlap:sbo"]
    assert state.decision() is None


@pytest.mark.parametrize("settings", [TBO_ONLY], indirect=True)
def test_tbo_only_captures_tbo_and_none(settings: Any) -> None:
    r = _runner()
    labels: list[str] = []
    glue.capture_one_shape(
        lambda runner, size, forward: labels.append(
            DecodeCudaGraphRunner._make_graph_key(runner, size).variant_label), r, 2, None)
    assert labels == ["overlap:tbo", "overlap:none"]


def test_upstreams_label_is_kept() -> None:
    assert glue.mode_label("nolora", "tbo") == "nolora+overlap:tbo"
    assert glue.mode_label(None, "none") == "overlap:none"


def _tbo(primary: Any, *children: Any) -> Any:
    b = _bare(TboAttnBackend)
    b.primary, b.children = primary, list(children)
    return b


def _hybrid(prefill: Any, decode: Any) -> Any:
    b = _bare(HybridAttnBackend)
    b.prefill_backend, b.decode_backend = prefill, decode
    return b


STALE = [FlashInferMLAAttnBackend, TRTLLMMLABackend, CuteDslMLABackend]
SAFE = [TritonAttnBackend]  # fa3 and flashmla are safe too but need libcuda to import


@pytest.mark.parametrize("cls", STALE, ids=lambda c: c.__name__)
@pytest.mark.parametrize("wrap", ["plain", "tbo", "tbo_child", "hybrid_decode"])
def test_backends_keeping_the_last_captures_state_are_refused_before_any_capture(
        settings: Any, cls: type, wrap: str) -> None:
    bad, ok = _bare(cls), _bare(TritonAttnBackend)
    backend = {"plain": bad, "tbo": _tbo(bad, ok, ok), "tbo_child": _tbo(ok, ok, bad),
               "hybrid_decode": _hybrid(ok, bad)}[wrap]
    captured: list[int] = []
    with pytest.raises(SettingsError) as err:
        glue.capture_one_shape(lambda runner, size, forward: captured.append(size),
                               _runner(attn_backend=backend), 8, None)
    assert captured == []
    msg = str(err.value)
    assert cls.__name__ in msg and "tbo, sbo, none" in msg, msg
    assert "--decode-attention-backend triton, fa3 or flashmla" in msg, msg


@pytest.mark.parametrize("cls", SAFE, ids=lambda c: c.__name__)
def test_backends_writing_buffers_allocated_once_capture_every_mode(settings: Any,
                                                                     cls: type) -> None:
    for backend in (_bare(cls), _tbo(_bare(cls), _bare(cls), _bare(cls)),
                    _hybrid(_bare(FlashInferMLAAttnBackend), _bare(cls))):  # prefill side: any
        labels: list[str] = []

        def orig(runner: Any, size: int, forward: Any, into: list[str] = labels) -> None:
            into.append(DecodeCudaGraphRunner._make_graph_key(runner, size).variant_label)

        glue.capture_one_shape(orig, _runner(attn_backend=backend), 4, None)
        assert labels == ["overlap:tbo", "overlap:sbo", "overlap:none"], (cls, labels)


@pytest.mark.parametrize("settings", [FIXED_TBO], indirect=True)
def test_one_graph_set_needs_no_shared_state(settings: Any) -> None:
    sizes: list[int] = []
    glue.capture_one_shape(lambda runner, size, forward: sizes.append(size),
                           _runner(attn_backend=_bare(FlashInferMLAAttnBackend)), 4, None)
    assert sizes == [4]  # upstream's single set, whatever the backend


GIB = 1 << 30


def test_a_further_set_must_leave_the_activation_reserve_free() -> None:
    kw: dict[str, Any] = {"mode": "sbo", "bs": 64, "max_bs": 256, "modes": ("tbo", "sbo", "none")}
    glue.check_memory(int(4.5 * GIB), GIB, int(3.5 * GIB), **kw)  # leaves exactly the floor
    with pytest.raises(SettingsError) as err:
        glue.check_memory(int(4.5 * GIB) - 1, GIB, int(3.5 * GIB), **kw)
    msg = str(err.value)
    for part in ("sbo decode graph of batch size 64", "4.50 GiB free", "took 1.00 GiB",
                 "3.50 GiB must stay free", "3 sets (tbo, sbo, none)",
                 "--cuda-graph-max-bs-decode 256", "0.00 GiB more"):
        assert part in msg, (part, msg)
    with pytest.raises(SettingsError, match="1.50 GiB more stay free"):
        glue.check_memory(3 * GIB, GIB, int(3.5 * GIB), **kw)


def test_the_floor_is_sglangs_own_activation_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang.srt.runtime_context as rc

    for chunk, mib in ((4096, 512 + 6144), (1024, 512 + 3072), (0, 512 + 3072)):
        monkeypatch.setattr(rc, "get_schedule", lambda c=chunk: SimpleNamespace(
            chunked_prefill_size=c))
        assert glue.memory_floor() == mib << 20, chunk


def test_capture_stops_at_the_first_set_that_does_not_fit(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    free = [10 * GIB]
    monkeypatch.setattr(glue, "_free_bytes", lambda: free[0])
    monkeypatch.setattr(glue, "memory_floor", lambda: 2 * GIB)
    labels: list[str] = []

    def orig(runner: Any, size: int, forward: Any) -> None:
        labels.append(DecodeCudaGraphRunner._make_graph_key(runner, size).variant_label)
        free[0] -= 3 * GIB  # each set of this size takes 3 GiB

    with pytest.raises(SettingsError, match="the none decode graph of batch size 16"):
        glue.capture_one_shape(orig, _runner(max_bs=16), 16, None)
    assert labels == ["overlap:tbo", "overlap:sbo"]  # 4 GiB free - 3 GiB < 2 GiB: no third set


def test_the_second_set_is_checked_against_the_first_sets_cost(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    free = [10 * GIB]
    monkeypatch.setattr(glue, "_free_bytes", lambda: free[0])
    monkeypatch.setattr(glue, "memory_floor", lambda: 3 * GIB)
    labels: list[str] = []

    def orig(runner: Any, size: int, forward: Any) -> None:
        labels.append(DecodeCudaGraphRunner._make_graph_key(runner, size).variant_label)
        free[0] -= 4 * GIB

    with pytest.raises(SettingsError, match="the sbo decode graph of batch size 32"):
        glue.capture_one_shape(orig, _runner(max_bs=32), 32, None)  # 6 GiB - 4 GiB < 3 GiB
    assert labels == ["overlap:tbo"]


@pytest.mark.parametrize("settings", [TBO_ONLY], indirect=True)
def test_two_graph_sets_already_need_shared_state(settings: Any) -> None:
    with pytest.raises(SettingsError, match="FlashInferMLAAttnBackend"):
        glue.capture_one_shape(lambda runner, size, forward: None,
                               _runner(attn_backend=_bare(FlashInferMLAAttnBackend)), 4, None)
