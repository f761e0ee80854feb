"""The TBO split decisions inside SGLang come from the plugin's planning (hooks on the real
`two_batch_overlap` module, applied by SGLang's HookRegistry)."""

from __future__ import annotations

import inspect

import pytest

from tests.conftest import require_module

tbo = require_module("sglang.srt.batch_overlap.two_batch_overlap")
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.runtime_context import get_flags  # noqa: E402

from sglang_overlap.sglang.upstream import two_batch_overlap as glue  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _plugins_loaded() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()


@pytest.fixture(autouse=True)
def tbo_on():
    """The plugin's TBO on (--enable-two-batch-overlap); a test may switch it off."""
    from sglang_overlap.settings import OverlapSettings
    from sglang_overlap.sglang import state

    state.configure(OverlapSettings(enable_two_batch_overlap=True))
    yield lambda on: state.configure(OverlapSettings(enable_two_batch_overlap=on))
    state.configure(None)


@pytest.fixture()
def threshold():
    moe = get_flags().moe
    saved = moe.tbo_token_distribution_threshold
    yield lambda t: setattr(moe, "tbo_token_distribution_threshold", t)
    moe.tbo_token_distribution_threshold = saved


@pytest.mark.parametrize(("name", "ours"), [
    ("compute_split_seq_index", glue.split_seq_index_hook),
    ("compute_split_token_index", glue.split_token_index_hook),
    ("_is_two_chunk_split_enabled", glue.two_chunk_hook),
])
def test_sglang_split_functions_are_the_plugins(name: str, ours) -> None:
    fn = getattr(tbo, name)
    assert inspect.unwrap(fn).__module__ == tbo.__name__ and inspect.unwrap(fn) is not fn
    hooks = [c.cell_contents for c in fn.__closure__ or ()]
    assert ours in hooks, f"{name} runs {hooks}, not the plugin's {ours.__qualname__}"


@pytest.mark.parametrize(
    ("lens", "expected"),
    [  # upstream's unit-test values at t = 0.48 (two-chunk where marked)
        ([42], (0, 21, True)), ([42, 999], (1, 520, True)), ([999, 42], (0, 520, True)),
        ([498, 502], (1, 498, False)), ([4096] * 4, (2, 8192, False)),
        ([1, 1, 1, 1, 99999], (4, 50001, True)), ([], (0, 0, False)), ([1], (0, 0, False)),
    ],
)
def test_extend_splits_through_sglang(lens, expected, threshold) -> None:
    threshold(0.48)
    seq = tbo.compute_split_seq_index(ForwardMode.EXTEND, sum(lens), lens, None)
    tok = tbo.compute_split_token_index(seq, ForwardMode.EXTEND, lens, None)
    assert (seq, tok, tbo._is_two_chunk_split_enabled(lens)) == expected


def test_threshold_zero_disables_two_chunk(threshold) -> None:
    threshold(0.0)
    assert not tbo._is_two_chunk_split_enabled([42])
    assert tbo.compute_split_seq_index(ForwardMode.EXTEND, 42, [42], None) == 0


def test_boundary_cut_is_a_plain_split_deliberately(threshold) -> None:
    threshold(0.48)
    # [2, 3]: the half-token cut (2) is the request boundary. Upstream plans a two-chunk split
    # with a zero-token copy of request 1 in child A; the plugin a boundary split, same indices.
    assert tbo.compute_split_seq_index(ForwardMode.EXTEND, 5, [2, 3], None) == 1
    assert tbo.compute_split_token_index(1, ForwardMode.EXTEND, [2, 3], None) == 2
    assert not tbo._is_two_chunk_split_enabled([2, 3])
    assert inspect.unwrap(tbo._is_two_chunk_split_enabled)([2, 3])


def test_with_tbo_off_upstream_decides(threshold, tbo_on) -> None:
    """The hooks hand straight back to upstream when the plugin's TBO is off."""
    threshold(0.48)
    tbo_on(False)
    assert tbo._is_two_chunk_split_enabled([2, 3])  # upstream's own answer (see above)
    assert tbo.compute_split_seq_index(ForwardMode.DECODE, 7, None, 1) == 3


@pytest.mark.parametrize(("mode", "tokens", "tnps", "expected"), [
    (ForwardMode.DECODE, 1, 1, (0, 0)), (ForwardMode.DECODE, 7, 1, (3, 3)),
    (ForwardMode.DECODE, 256, 1, (128, 128)), (ForwardMode.TARGET_VERIFY, 12, 4, (1, 4)),
    (ForwardMode.IDLE, 0, 0, (0, 0)),
])
def test_decode_verify_idle(mode, tokens, tnps, expected) -> None:
    seq = tbo.compute_split_seq_index(mode, tokens, None, tnps)
    assert (seq, tbo.compute_split_token_index(seq, mode, None, tnps)) == expected


def test_cuda_graph_replay_split_uses_the_plan() -> None:
    assert tbo.compute_split_indices_for_cuda_graph_replay(ForwardMode.IDLE, 8, None) == (4, 4)


def test_inconsistent_split_index_is_refused(threshold) -> None:
    threshold(0.48)
    with pytest.raises(ValueError, match="not the planned"):
        glue.compute_split_token_index(0, ForwardMode.EXTEND, [498, 502], None)


def test_no_hook_replaces_upstream_outright() -> None:
    """hooks.py's promise: with its mode off every hook hands back to upstream's function."""
    from sglang_overlap.sglang import hooks

    assert [s.target for s in hooks.all_specs() if s.kind == "replace"] == []
