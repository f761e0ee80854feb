"""What `upstream/token_dispatcher_deepep.py` and `upstream/moe_utils.py` copy from upstream by
hand is read back from the
pinned upstream functions: the kwargs `_combine_core` passes to `low_latency_combine`, the impl
classes `DeepEPDispatcher.__init__` builds (the globals the torch_a2a hook swaps), and the flag
`initialize_moe_config` sets (the side effect repeated when the SM90 refusal is lifted)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from tests.conftest import require_module

deepep = require_module("sglang.srt.layers.moe.token_dispatcher.deepep")

from sglang_overlap.sglang import hooks  # noqa: E402
from sglang_overlap.sglang.upstream import moe_utils  # noqa: E402
from sglang_overlap.sglang.upstream import token_dispatcher_deepep as deepep_dispatcher  # noqa: E402


def _tree(fn: object) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(fn))))  # type: ignore[arg-type]


def _pinned(target: str) -> None:
    assert target in {t for t, _ in hooks.all_pins()}, f"{target} is not pinned"


def test_the_base_kwargs_are_what_the_pinned_combine_passes() -> None:
    _pinned(deepep_dispatcher.LL_COMBINE_CORE)
    tree = _tree(deepep._DeepEPDispatcherImplLowLatency._combine_core)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "low_latency_combine"]
    assert calls, "upstream's _combine_core no longer calls low_latency_combine"
    for call in calls:
        passed = {k.arg for k in call.keywords if k.arg is not None}
        base = passed & deepep_dispatcher._BASE_KWARGS
        assert base == deepep_dispatcher._BASE_KWARGS, f"{passed=}"


def test_the_swapped_impls_are_what_the_pinned_init_builds() -> None:
    _pinned(deepep_dispatcher.DISPATCHER_INIT)
    names = {n.id for n in ast.walk(_tree(deepep.DeepEPDispatcher.__init__))
             if isinstance(n, ast.Name)}
    assert {"_DeepEPDispatcherImplLowLatency", "_DeepEPDispatcherImplNormal"} <= names


def test_the_repeated_side_effect_is_what_the_pinned_function_does() -> None:
    from sglang.srt.layers.moe import utils

    _pinned(moe_utils.INITIALIZE_MOE_CONFIG)
    targets = {ast.unparse(t) for n in ast.walk(_tree(utils.initialize_moe_config))
               if isinstance(n, ast.Assign) for t in n.targets}
    assert "moe.sbo_enabled" in targets, targets


def test_a_send_whose_producer_never_launched_raises_instead_of_spinning() -> None:
    import torch

    from sglang_overlap.planning.sbo_path import SboDecision, SboPath
    from sglang_overlap.sglang import sbo_decision

    class Buffer:
        calls = 0

        def low_latency_combine(self, **kwargs: object) -> str:
            Buffer.calls += 1
            return "combined"

    class Args:
        signal, threshold, num_sms = torch.zeros(4, dtype=torch.int32), 16, 3

    decision = SboDecision(SboPath.PER_EXPERT, "t", granularity="expert",
                           gemm_signal_source="plugin", combine_form="per_expert")
    buf = deepep_dispatcher._FormBuffer(Buffer(), decision, Args())
    base = dict(x=0, topk_idx=0, topk_weights=0, handle=0, async_finish=False,
                return_recv_hook=True)
    sbo_decision.note_signal_raised(torch.zeros(4, dtype=torch.int32))  # another step's signal
    with pytest.raises(RuntimeError, match="no down GEMM of this step"):
        buf.low_latency_combine(**base, overlap=True)
    assert Buffer.calls == 0
    sbo_decision.note_signal_raised(Args.signal)
    assert buf.low_latency_combine(**base, overlap=True) == "combined"
    with pytest.raises(RuntimeError):  # one producer launch, one send
        buf.low_latency_combine(**base, overlap=True)
