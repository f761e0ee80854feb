"""The kit's stand-in CUDA-graph backend (cpu_shim/sglang_cpu_shim/graphs.py) replays like a
graph: on the captured static buffers, into the captured output objects, counted per shape."""

from __future__ import annotations

import json
import sys
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

_SHIM = str(Path(__file__).resolve().parent / "cpu_shim")
sys.path.insert(0, _SHIM)
from sglang_cpu_shim import graphs  # noqa: E402

sys.path.remove(_SHIM)  # the module stays loaded; nothing else imports from the shim's folder

ShapeKey = namedtuple("ShapeKey", "size stream_idx variant_label attention_variant")


class _Group:
    def __init__(self) -> None:
        self.barriers = 0

    def barrier(self) -> None:
        self.barriers += 1


@pytest.fixture
def counters(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(graphs, "COUNTERS", graphs.Counters())
    monkeypatch.setenv(graphs.COUNTERS_ENV, str(tmp_path))
    return tmp_path


def _capture(static: torch.Tensor) -> tuple[graphs.StandInGraphBackend, _Group, list[int]]:
    group, runs = _Group(), []

    def forward() -> SimpleNamespace:  # reads the static buffer, as a runner's closure does
        runs.append(1)
        return SimpleNamespace(logits=static * 2, n=static.shape[0])

    backend = graphs.StandInGraphBackend(None, tp_group=group, tp_rank=1)
    key = ShapeKey(4, None, None, None)
    with backend.capture_session(None):
        backend.capture_one(key, forward)
    return backend, group, runs


def test_replay_reads_the_static_buffers_into_the_captured_output(counters: Path) -> None:
    static = torch.zeros(4)
    backend, group, runs = _capture(static)
    key = next(iter(backend._forwards))
    assert len(runs) == 3 and group.barriers == 2  # two warm-ups, then the recorded run
    captured = backend._outputs[key]
    static.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # what a runner's load_batch does
    out = backend.replay(key, None)
    assert out is captured and torch.equal(out.logits, torch.tensor([2.0, 4.0, 6.0, 8.0]))
    fresh = torch.full((4,), 9.0)  # an input never copied into the static buffer ...
    out = backend.replay(key, None)
    assert not torch.equal(out.logits, fresh * 2)  # ... is not seen by the replay
    (snap,) = graphs.read_counters(counters)
    assert snap["rank"] == 1 and snap["captures"] == {"bs4": 1} and snap["replays"] == {"bs4": 2}
    assert json.loads((counters / f"graphs-{snap['pid']}.json").read_text()) == snap


def test_a_replay_cannot_change_a_shape(counters: Path) -> None:
    static = torch.zeros(4)
    backend, _, _ = _capture(static)
    key = next(iter(backend._forwards))
    backend._forwards[key] = lambda: SimpleNamespace(logits=torch.zeros(5), n=4)
    with pytest.raises(RuntimeError, match="captured"):
        backend.replay(key, None)


def test_python_values_that_differ_from_capture_are_counted(counters: Path) -> None:
    backend, _, _ = _capture(torch.zeros(4))
    key = next(iter(backend._forwards))
    backend._forwards[key] = lambda: SimpleNamespace(logits=torch.ones(4), n=3)
    out = backend.replay(key, None)
    assert out.n == 4  # the captured value, as a graph returns it
    assert graphs.COUNTERS.python_divergence == 1


def test_a_replay_runs_the_overlap_mode_it_was_captured_in(counters: Path) -> None:
    """A graph replays the kernels of its capture: the plugin's step decision (and SGLang's
    TBO/SBO switches, where a runtime context exists) seen by a replay are the capture's, whatever
    they are live, and the live ones are back after the replay."""
    from sglang_overlap.modes import Mode, Phase, StepDecision
    from sglang_overlap.sglang import state

    seen: list[object] = []
    backend = graphs.StandInGraphBackend(None, tp_group=_Group(), tp_rank=0)
    key = ShapeKey(4, None, None, None)
    captured, live = (StepDecision(m, Phase.DECODE) for m in (Mode.SBO, Mode.NONE))
    with state.step(captured):
        with backend.capture_session(None):
            backend.capture_one(key, lambda: (seen.append(state.decision()), torch.zeros(1))[1])
    with state.step(live):
        seen.clear()
        backend.replay(key, None)
        assert seen == [captured]
        assert state.decision() is live
    assert state.decision() is None


def test_the_snapshot_carries_the_deep_ep_stand_ins_calls(counters: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, _SHIM)
    try:
        from sglang_cpu_shim import deep_ep_gloo, deepep
    finally:
        sys.path.remove(_SHIM)
    monkeypatch.setattr(deep_ep_gloo, "COUNTERS", deep_ep_gloo.Counter({"dispatch": 3}))
    called = []
    hooks = SimpleNamespace(hook_dict={1: None, 2: None})  # SGLang's DeepEPPDispatchHooks
    deepep.dispatch_hooks(lambda self, d: called.append(d), hooks, "dispatcher")
    deepep.dispatch_hooks(lambda self, d: called.append(d), SimpleNamespace(hook_dict={}), "d2")
    assert called == ["dispatcher", "d2"]
    graphs.COUNTERS.flush()
    (snap,) = graphs.read_counters(counters)
    assert snap["deep_ep"] == {"dispatch": 3, "dispatch_hooks": 2}
