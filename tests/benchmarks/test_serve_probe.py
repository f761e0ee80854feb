"""benchmarks/serve/probe (sglang_serve_probe, the serve run's benchmark-only plugin): its step
timing on stand-in forward batches and CUDA events, the files it writes, and serve_suite's and
report.py's reading of them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.serve import report, serve_suite

PROBE = (Path(__file__).resolve().parents[2]
         / "benchmarks/serve/probe/sglang_serve_probe/__init__.py")


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("sglang_serve_probe_under_test", PROBE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setenv("SGLANG_SERVE_PROBE_DIR", str(tmp_path))
    return mod


class Mode:
    def __init__(self, name: str) -> None:
        self.name = name

    def is_idle(self) -> bool:
        return self.name == "idle"

    def is_decode(self) -> bool:
        return self.name == "decode"

    def is_extend(self) -> bool:
        return self.name == "extend"


def batch(mode: str, bs: int = 1) -> Any:
    return SimpleNamespace(forward_mode=Mode(mode), batch_size=bs)


class Event:
    """A CUDA event stand-in: `done` says whether query() sees it complete; its time stamp in
    ms is `at`."""

    def __init__(self, at: float, done: bool = True) -> None:
        self.at, self.done = at, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Event) -> float:
        return end.at - self.at


def test_step_kind(probe: Any) -> None:
    mod = probe
    assert mod.step_kind(batch("extend", 7)) == "prefill"
    assert mod.step_kind(batch("decode", 16)) == "decode bs=16"
    assert mod.step_kind(batch("idle")) is None
    assert mod.step_kind(batch("other")) is None


def test_forward_times_each_kind_and_reads_events_in_order_without_waiting(
        probe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = iter([Event(0.0), Event(2.5),                # prefill: 2.5 ms
                   Event(10.0), Event(11.0, done=False),  # decode bs=1, not complete yet
                   Event(20.0), Event(21.5)])             # decode bs=1: 1.5 ms, behind it
    monkeypatch.setattr(probe, "_event", lambda: next(events))
    clock = iter([1.0, 1.004, 2.0, 2.001, 3.0, 3.003])
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock))
    runner = SimpleNamespace(is_draft_worker=False)
    calls: list[Any] = []

    def orig(self: Any, fb: Any, *args: Any, **kwargs: Any) -> str:
        calls.append((self, fb, args, kwargs))
        return "out"

    pre = batch("extend", 3)
    assert probe._forward(orig, runner, pre, 5, x=1) == "out"
    assert calls == [(runner, pre, (5,), {"x": 1})]
    saved = json.loads(next(tmp_path.glob("graphs-*.json")).read_text())
    assert saved["steps"]["prefill"] == {"n": 1, "host_s": pytest.approx(0.004), "gpu_n": 1,
                                         "gpu_ms": 2.5}
    probe._forward(orig, runner, batch("decode"))
    probe._forward(orig, runner, batch("decode"))
    row = probe._steps["decode bs=1"]
    assert row["n"] == 2 and row["host_s"] == pytest.approx(0.004)
    assert row["gpu_n"] == 0 and len(probe._pending) == 2  # the first has not completed
    probe._pending[0][2].done = True
    probe._pending.append(("prefill", Event(30.0), Event(39.0, done=False)))  # still running
    probe.drain()
    assert row["gpu_n"] == 2 and row["gpu_ms"] == pytest.approx(2.5)
    assert [k for k, _, _ in probe._pending] == ["prefill"]  # read in order, the rest left
    assert probe._steps["prefill"]["gpu_n"] == 1


def test_untimed_steps_pass_straight_through(probe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "_event", lambda: pytest.fail("timed"))
    orig = lambda self, fb: "out"  # noqa: E731
    assert probe._forward(orig, SimpleNamespace(is_draft_worker=True), batch("decode")) == "out"
    assert probe._forward(orig, SimpleNamespace(), batch("idle")) == "out"
    assert probe._steps == {}


def test_register_hooks_the_forward_and_the_graph_backend(probe: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    seen: list[tuple[str, Any, Any]] = []
    monkeypatch.setattr(hook_registry.HookRegistry, "register",
                        lambda target, fn, kind: seen.append((target, fn, kind)))
    probe.register()
    probe.register()  # once per target
    assert [(t.rsplit(".", 2)[-2:], fn) for t, fn, _ in seen] == [
        (["FullCudaGraphBackend", "capture_one"], probe._capture_one),
        (["FullCudaGraphBackend", "replay"], probe._replay),
        (["ModelRunner", "forward"], probe._forward)]
    assert {str(k.value) for _, _, k in seen} == {"around"}


def test_serve_suite_sums_every_process_file(tmp_path: Path) -> None:
    (tmp_path / "graphs-1.json").write_text(json.dumps({
        "captures": {"": 7}, "replays": {"": 3},
        "steps": {"prefill": {"n": 2, "host_s": 0.5, "gpu_n": 2, "gpu_ms": 40.0}}}))
    (tmp_path / "graphs-2.json").write_text(json.dumps({
        "captures": {"": 1}, "replays": {"overlap:sbo": 4},
        "steps": {"prefill": {"n": 1, "host_s": 0.25, "gpu_n": 0, "gpu_ms": 0.0},
                  "decode bs=1": {"n": 4, "host_s": 0.01, "gpu_n": 4, "gpu_ms": 7.0}}}))
    (tmp_path / "graphs-3.json").write_text(json.dumps({"captures": {}, "replays": {}}))  # old
    got = serve_suite.probe_counts(tmp_path)
    assert got == {"captures": {"": 8}, "replays": {"": 3, "overlap:sbo": 4},
                   "steps": {"prefill": {"n": 3, "host_s": 0.75, "gpu_n": 2, "gpu_ms": 40.0},
                             "decode bs=1": {"n": 4, "host_s": 0.01, "gpu_n": 4,
                                             "gpu_ms": 7.0}}}


def test_report_prints_mean_host_and_gpu_ms_per_kind() -> None:
    steps = {"prefill": {"n": 4, "host_s": 0.2, "gpu_n": 2, "gpu_ms": 90.0},
             "decode bs=1": {"n": 10, "host_s": 0.005, "gpu_n": 0, "gpu_ms": 0.0},
             "decode bs=3": {"n": 1, "host_s": 1.0, "gpu_n": 1, "gpu_ms": 1.0}}
    assert report.step_times({"graphs": {"steps": steps}}) == {
        "decode bs=1": (pytest.approx(0.5), None, 10), "prefill": (pytest.approx(50.0), 45.0, 4)}
    assert report.steps_table({"a": {"graphs": {}}, "b": {}}) == []
    base = {"name": "base", "flags": [], "tree": "sgl-deep-ep", "modes": [], "planted": False,
            "tokens_batch": [], "tokens_single": [], "bench": {}, "capture": [],
            "graphs": {"steps": steps}, "metrics": [], "plugin_log": []}
    assert report.table({"base": base}, [])[0].endswith("| base | 0.50 / - (10) | - | "
                                                        "50.00 / 45.00 (4) |")
    lines = report.steps_table({"base": {"graphs": {"steps": steps}}, "x": {}})
    assert lines[-3:] == ["| server | decode bs=1 | decode bs=64 | prefill |", "|---|---|---|---|",
                          "| base | 0.50 / - (10) | - | 50.00 / 45.00 (4) |"]


def test_step_kind_of_sglangs_own_forward_modes(probe: Any) -> None:
    fbi = pytest.importorskip("sglang.srt.model_executor.forward_batch_info")
    kinds = {m.name: probe.step_kind(SimpleNamespace(forward_mode=m, batch_size=4))
             for m in (fbi.ForwardMode.EXTEND, fbi.ForwardMode.MIXED, fbi.ForwardMode.DECODE,
                       fbi.ForwardMode.IDLE)}
    assert kinds == {"EXTEND": "prefill", "MIXED": "prefill", "DECODE": "decode bs=4",
                     "IDLE": None}


def test_a_replay_inside_a_timed_step_is_saved_after_the_steps_time(
        probe: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file write of a replay is not part of the step's timed window, yet the file is
    current whenever the step hands back to SGLang; a replay outside a timed step (a draft
    model's) is saved at once."""
    monkeypatch.setattr(probe, "_event", lambda: None)

    def saved() -> dict[str, Any]:
        files = list(tmp_path.glob("graphs-*.json"))
        return json.loads(files[0].read_text()) if files else {}

    key = SimpleNamespace(variant_label="overlap:sbo")
    seen_inside: list[dict[str, Any]] = []

    def orig(self: Any, fb: Any) -> str:
        probe._replay(lambda s, k: None, None, key)
        seen_inside.append(saved())
        return "out"

    assert probe._forward(orig, SimpleNamespace(), batch("decode", 2)) == "out"
    assert seen_inside == [{}]  # not written inside the timed window
    got = saved()
    assert got["replays"] == {"overlap:sbo": 1} and got["steps"]["decode bs=2"]["n"] == 1
    probe._forward(orig, SimpleNamespace(is_draft_worker=True), batch("decode", 2))
    assert seen_inside[-1]["replays"] == {"overlap:sbo": 2}  # untimed: saved by the replay

    def boom(self: Any, fb: Any) -> None:
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        probe._forward(boom, SimpleNamespace(), batch("extend"))
    assert probe._timing == [0]
    probe._replay(lambda s, k: None, None, key)
    assert saved()["replays"] == {"overlap:sbo": 3}


def test_event_records_on_cuda_where_there_is_one(probe: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert probe._cuda() is torch.cuda
    recorded: list[dict[str, Any]] = []

    class FakeEvent:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

        def record(self) -> None:
            recorded.append(self.kwargs)

    monkeypatch.setattr(probe, "_cuda", lambda: SimpleNamespace(Event=FakeEvent))
    assert isinstance(probe._event(), FakeEvent) and recorded == [{"enable_timing": True}]
    monkeypatch.setattr(probe, "_cuda", lambda: None)
    assert probe._event() is None
