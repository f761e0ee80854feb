"""SBO glue against the real SGLang 0.5.23 modules on CPU, with an emulated SM90 GPU.

The emulation sets the two facts upstream's SM90 check reads (`is_cuda()` in
sglang.srt.layers.moe.utils and torch.cuda.get_device_capability) and tells the probe the same
through SGLANG_OVERLAP_ASSUME_ARCH. The first test shows upstream really refuses under it.
"""

from __future__ import annotations

import inspect
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import require_module

require_module("sglang")

from sglang_overlap.kernels.capabilities import probe  # noqa: E402
from sglang_overlap.kernels.package_source import read_params  # noqa: E402
from sglang_overlap.planning.sbo_path import SboDecision, SboPath  # noqa: E402
from sglang_overlap.settings import SettingsError  # noqa: E402
from sglang_overlap.sglang import sbo_decision  # noqa: E402
from sglang_overlap.sglang.upstream import (  # noqa: E402
    deep_gemm_wrapper_entrypoint as deep_gemm_wrapper,
)
from sglang_overlap.sglang.upstream import moe_utils, single_batch_overlap  # noqa: E402
from sglang_overlap.sglang.upstream import (  # noqa: E402
    token_dispatcher_deepep as deepep_dispatcher,
)

apply_plugin_signal = single_batch_overlap.apply_plugin_signal
masked_gemm = deep_gemm_wrapper.masked_gemm

BASE = ["--device", "cpu", "--tp", "2", "--enable-single-batch-overlap",
        "--moe-a2a-backend", "deepep"]
INSTALLED_LEGACY = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}." \
    f"{sys.version_info.minor}" / "site-packages" / "deep_ep" / "buffers" / "legacy.py"


@pytest.fixture(scope="module")
def contexts(tiny_dsv3: Path) -> dict[str, Any]:
    from sglang.srt.runtime_context import create_context

    from sglang_overlap.sglang.upstream.server_args import parse_server_args

    out = {}
    variants = {"auto": BASE, "force": [*BASE, "--sbo-down-gemm-overlap", "force"],
                "torch_a2a": [*BASE[:-1], "torch_a2a"]}
    for name, argv in variants.items():
        server_args, _ = parse_server_args(["--model-path", str(tiny_dsv3), *argv])
        out[name] = create_context(server_args, role="scheduler")
    return out


@pytest.fixture()
def sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang.srt.layers.moe.utils as moe_utils

    monkeypatch.setattr(moe_utils, "is_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    monkeypatch.setenv("SGLANG_OVERLAP_ASSUME_ARCH", "sm90")


@pytest.fixture(autouse=True)
def _fresh_state() -> Any:
    saved = dict(sbo_decision._state)
    sbo_decision._state.update(decision=None, report=None, logged=set())
    yield
    sbo_decision._state.update(saved)


def _upstream_init() -> Any:
    from sglang.srt.layers.moe import utils

    return inspect.unwrap(utils.initialize_moe_config)


def _fake_kernels(root: Path) -> Path:
    """The installed sgl-deep-ep's own legacy.py, without triton beside it."""
    pkg = root / "deep_ep" / "buffers"
    pkg.mkdir(parents=True)
    shutil.copy(INSTALLED_LEGACY, pkg / "legacy.py")
    (pkg / "__init__.py").write_text("")
    (root / "deep_ep" / "__init__.py").write_text("from .buffers.legacy import Buffer\n")
    meta = root / "sgl_deep_ep-0.1.2.post1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: sgl-deep-ep\n"
                                   "Version: 0.1.2.post1\n")
    return root


def test_upstream_refuses_sm90(contexts: dict[str, Any], sm90: None) -> None:
    from sglang.srt.runtime_context import use_context

    with use_context(contexts["auto"]), pytest.raises(ValueError, match="SM90"):
        _upstream_init()()


def test_hook_lifts_refusal_and_picks_per_expert(contexts: dict[str, Any], sm90: None,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    from sglang.srt.batch_overlap.single_batch_overlap import SboFlags
    from sglang.srt.runtime_context import get_flags, use_context

    report = probe(assume_arch="sm90")
    if not report.triton:
        pytest.skip("triton not installed: per-expert needs the plugin's signal GEMM")
    caplog.set_level(logging.INFO, logger="sglang_overlap")
    with use_context(contexts["auto"]), sbo_decision.probe_override(report):
        moe_utils.initialize_moe_config(_upstream_init())
        assert get_flags().moe.sbo_enabled is True
        decision = sbo_decision.active_decision()
        assert decision is not None and decision.path is SboPath.PER_EXPERT, decision
        flag = inspect.unwrap(SboFlags.__dict__[
            "enable_combine_down_gemm_two_stream_overlap"].__func__)
        assert single_batch_overlap.down_gemm_flag(flag, SboFlags) is True
        assert SboFlags.enable_dispatch_shared_one_stream_overlap()
        moe_utils.initialize_moe_config(_upstream_init())  # a second call logs nothing new
    lines = [r.getMessage() for r in caplog.records if "SBO on sm90" in r.getMessage()]
    assert len(lines) == 1 and "per_expert" in lines[0] and "0.1.2.post1" in lines[0], lines
    producer = [r.getMessage() for r in caplog.records if "down-GEMM producer" in r.getMessage()]
    assert len(producer) == 1 and f"(triton {report.triton_version}): " in producer[0], producer


def test_torch_a2a_sbo_starts_on_sm90_without_any_kernel(contexts: dict[str, Any], sm90: None,
                                                         tmp_path: Path) -> None:
    # torch_a2a computes experts and signals in the engine: even with no deep_ep/deep_gemm/triton
    # at all, SBO must start on Hopper (upstream would refuse), and no kernel path is chosen.
    from sglang.srt.runtime_context import get_flags, use_context

    from sglang_overlap.sglang import state as runtime

    nothing = probe(assume_arch="sm90", search_path=[str(tmp_path)])
    assert nothing.deep_ep.version is None and not nothing.triton
    with use_context(contexts["torch_a2a"]), sbo_decision.probe_override(nothing):
        runtime.configure(None)
        try:
            moe_utils.initialize_moe_config(_upstream_init())
            assert get_flags().moe.sbo_enabled is True
            assert sbo_decision.active_decision() is None
            assert runtime.settings().requested_a2a_backend == "torch_a2a"
        finally:
            runtime.configure(None)


def test_without_signal_gemm_degrades_to_shared_expert_only(
        contexts: dict[str, Any], sm90: None, tmp_path: Path) -> None:
    from sglang.srt.batch_overlap.single_batch_overlap import SboFlags
    from sglang.srt.runtime_context import get_flags, use_context

    report = probe(search_path=[str(_fake_kernels(tmp_path))], assume_arch="sm90")
    with use_context(contexts["auto"]), sbo_decision.probe_override(report):
        moe_utils.initialize_moe_config(_upstream_init())
        assert get_flags().moe.sbo_enabled is True
        decision = sbo_decision.active_decision()
        assert decision is not None and decision.path is SboPath.SHARED_EXPERT_ONLY
        assert "triton" in decision.reason
        flag = inspect.unwrap(SboFlags.__dict__[
            "enable_combine_down_gemm_two_stream_overlap"].__func__)
        assert single_batch_overlap.down_gemm_flag(flag, SboFlags) is False


def test_forced_path_without_kernels_is_refused(contexts: dict[str, Any], sm90: None,
                                                tmp_path: Path) -> None:
    from sglang.srt.runtime_context import use_context

    report = probe(search_path=[str(_fake_kernels(tmp_path))], assume_arch="sm90")
    with use_context(contexts["force"]), sbo_decision.probe_override(report), \
            pytest.raises(SettingsError) as err:
        moe_utils.initialize_moe_config(_upstream_init())
    msg = str(err.value)
    for needle in ("--sbo-down-gemm-overlap force", "sgl-deep-ep 0.1.2.post1", "pip install"):
        assert needle in msg, msg
    empty = probe(search_path=[str(tmp_path / "nothing")], assume_arch="sm90")
    with use_context(contexts["auto"]), sbo_decision.probe_override(empty), \
            pytest.raises(SettingsError, match="sgl-deep-ep is not installed"):
        moe_utils.initialize_moe_config(_upstream_init())


# --- the combine call, each probed form, against the installed signature --------------------

class _Stream:
    def wait_event(self, event: Any) -> None:
        pass


class _BindingBuffer:
    """Binds every low_latency_combine call to the installed sgl-deep-ep's declared parameters."""

    def __init__(self) -> None:
        params = read_params("deep_ep", "Buffer.low_latency_combine")
        assert params is not None
        self.sig = params.signature()
        self.kwargs: dict[str, Any] = {}

    def low_latency_combine(self, *a: Any, **k: Any) -> tuple[Any, Any, Any]:
        self.sig.bind(self, *a, **k)  # TypeError exactly where the real call would raise
        self.kwargs = k
        return "combined", None, None


def _impl(overlap: bool) -> tuple[Any, _BindingBuffer]:
    from sglang.srt.batch_overlap.single_batch_overlap import CombineOverlapArgs
    from sglang.srt.layers.moe.token_dispatcher.deepep import _DeepEPDispatcherImplLowLatency

    impl = object.__new__(_DeepEPDispatcherImplLowLatency)
    buf = _BindingBuffer()
    impl._get_buffer = lambda: buf  # type: ignore[method-assign]
    impl.return_recv_hook, impl.handle = True, ("handle",)
    impl.packed_recv_count = torch.zeros(4, dtype=torch.int32)
    signal = torch.zeros(4, dtype=torch.int32).view(torch.uint32)
    impl.overlap_args = CombineOverlapArgs(overlap=overlap, stream=_Stream(), wait_event=None,
                                           num_sms=3, signal=signal, threshold=16)
    impl.meta_overlap_args = {"compute_num_sms": 129}
    return impl, buf


def _call(impl: Any, hooked: bool) -> Any:
    from sglang.srt.layers.moe.token_dispatcher.deepep import _DeepEPDispatcherImplLowLatency

    orig = inspect.unwrap(_DeepEPDispatcherImplLowLatency._combine_core)
    x, ids, w = torch.zeros(4, 2, 8), torch.zeros(2, 2, dtype=torch.int64), torch.zeros(2, 2)
    if hooked:
        return deepep_dispatcher.combine_core(orig, impl, x, ids, w)
    return orig(impl, x, ids, w)


@pytest.mark.skipif(not INSTALLED_LEGACY.is_file(), reason="sgl-deep-ep not installed")
def test_upstream_hopper_combine_raises_typeerror_the_hook_does_not() -> None:
    impl, _ = _impl(overlap=True)
    impl.meta_overlap_args |= {"block_m": 64, "threshold": 129}  # as if deep_gemm returned them
    with pytest.raises(TypeError, match="packed_recv_count|comp_signal"):
        _call(impl, hooked=False)
    for path, form, want in [
        (SboPath.PER_EXPERT, "per_expert", {"overlap", "src_signals", "src_signal_expect_value"}),
        (SboPath.SHARED_EXPERT_ONLY, None, set()),
    ]:
        sbo_decision._state["decision"] = SboDecision(path, "test", combine_form=form)  # type: ignore
        impl, buf = _impl(overlap=form is not None)
        assert _call(impl, hooked=True)[0] == "combined"
        overlap_keys = set(buf.kwargs) - {"x", "topk_idx", "topk_weights", "handle",
                                          "async_finish", "return_recv_hook"}
        assert overlap_keys == want, (path, buf.kwargs)
        if form:
            assert buf.kwargs["src_signal_expect_value"] == 16
        assert impl.handle is None and impl.packed_recv_count is None


def test_plugin_signal_layout_is_static_across_calls() -> None:
    from sglang.srt.batch_overlap.single_batch_overlap import (
        CombineOverlapArgs,
        DownGemmOverlapArgs,
    )

    for gran, dtype in (("expert", torch.uint32), ("block", torch.int32)):
        decision = SboDecision(SboPath.PER_EXPERT if gran == "expert" else SboPath.FINE_GRAINED,
                               "t", granularity=gran, gemm_signal_source="plugin")  # type: ignore
        seen = []
        for _ in range(2):  # capture, then replay: same layout, fresh zeroed signal
            combine = CombineOverlapArgs(overlap=True, stream=None, wait_event=None, num_sms=3,
                                         signal=torch.zeros(1), threshold=129)
            down = DownGemmOverlapArgs(num_sms=129, signal=torch.zeros(1), start_event=None)
            meta: dict[str, Any] = {"compute_num_sms": 129}
            apply_plugin_signal(decision, combine, down, meta, (8, 256, 7168), 32, "cpu")
            lay = down.sbo_layout
            assert combine.signal is down.signal and combine.signal.dtype == dtype
            assert combine.signal.shape == lay.signal_shape and not combine.signal.view(
                torch.int32).any()
            # the GEMM keeps off the send's SMs (hybrid-ep: up to 32) on an even count
            assert combine.threshold == lay.expect_value
            assert down.num_sms == meta["compute_num_sms"] == (100 if gran == "expert" else 128)
            if gran == "expert":
                assert lay.expect_value == lay.blocks_per_expert * lay.n_tiles
            else:
                assert (meta["block_m"], meta["threshold"]) == (lay.block_m, lay.n_tiles)
            seen.append(lay)
        assert seen[0] == seen[1]


def test_hooks_resolve_in_sglang() -> None:
    """Register through SGLang's HookRegistry in a fresh process; every target is wrapped."""
    code = (
        "import inspect, logging, sys\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "from sglang_overlap.sglang.hooks import install\n"
        "from sglang_overlap.sglang.hooks import all_specs\n"
        "SBO_HOOKS = all_specs()\n"
        "install(SBO_HOOKS); HookRegistry.apply_hooks()\n"
        "import pkgutil\n"
        "for s in SBO_HOOKS:\n"
        "    mod, _, attr = s.target.rpartition('.')\n"
        "    owner = pkgutil.resolve_name(mod)\n"
        "    raw = inspect.getattr_static(owner, attr)\n"
        "    fn = getattr(raw, '__func__', raw)\n"
        "    assert getattr(fn, '__wrapped__', None) is not None, s.target\n"
        "print('ok', len(SBO_HOOKS))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    from sglang_overlap.sglang.hooks import all_specs

    assert done.returncode == 0 and f"ok {len(all_specs())}" in done.stdout, done.stderr[-3000:]


def test_masked_gemm_without_plugin_layout_is_upstreams_call() -> None:
    calls: list[tuple[Any, ...]] = []

    def orig(*a: Any, **k: Any) -> str:
        calls.append((a, k))
        return "deep_gemm"

    assert masked_gemm(orig, "lhs", "rhs", "out", "m", 5) == "deep_gemm"
    upstream_args = object()  # DeepGEMM-native signals (fine_grained via deep_gemm): untouched
    assert masked_gemm(orig, "lhs", "rhs", "out", "m", 5, overlap_args=upstream_args,
                            max_block_n=160) == "deep_gemm"
    assert calls[1][1]["overlap_args"] is upstream_args and calls[1][1]["max_block_n"] == 160


def _plugin_down_args(expected_m: int) -> Any:
    from sglang.srt.batch_overlap.single_batch_overlap import (
        CombineOverlapArgs,
        DownGemmOverlapArgs,
    )

    decision = SboDecision(SboPath.PER_EXPERT, "t", granularity="expert",  # type: ignore
                           gemm_signal_source="plugin")
    combine = CombineOverlapArgs(overlap=True, stream=None, wait_event=None, num_sms=3,
                                 signal=torch.zeros(1), threshold=1)
    down = DownGemmOverlapArgs(num_sms=129, signal=torch.zeros(1), start_event=None)
    apply_plugin_signal(decision, combine, down, {"compute_num_sms": 129}, (8, 256, 7168),
                            expected_m, "cpu")
    return down


def test_served_masked_gemm_is_the_down_gemm_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The glue's down GEMM is `kernels.down_gemm.signal_down_gemm` (the measured choice), with
    the layout, expected_m and SM budget the combine was told about."""
    from sglang_overlap.kernels import down_gemm

    seen: list[dict[str, Any]] = []

    def entry(a: Any, a_s: Any, b: Any, b_s: Any, out: Any, masked_m: Any, expected_m: int,
              **kw: Any) -> Any:
        seen.append(dict(kw, expected_m=expected_m))
        return down_gemm.choose_signal_path(kw["layout"].num_local_experts, expected_m, 256)

    from collections import Counter

    from sglang_overlap import stats

    monkeypatch.setattr(stats, "_series", {name: Counter() for name in stats.SERIES})
    monkeypatch.setattr(down_gemm, "signal_down_gemm", entry)
    down = _plugin_down_args(expected_m=128)
    got = masked_gemm(lambda *a, **k: "deep_gemm", ("a", "as"), ("b", "bs"), "out", "m",
                           128, overlap_args=down)
    assert got is None  # per expert: the combine takes no block_m / threshold
    assert down.num_sms == 100  # 132 SMs minus the 32 the per-expert send may hold
    assert seen == [{"signal": down.signal, "layout": down.sbo_layout, "compute_num_sms": 100,
                     "expected_m": 128}]
    ran = down_gemm.choose_signal_path(down.sbo_layout.num_local_experts, 128, 256).path
    masked_gemm(lambda *a, **k: "deep_gemm", ("a", "as"), ("b", "bs"), "out", "m", 128,
                overlap_args=down)
    # the producer that ran, counted per launch (the served producer in /metrics)
    assert stats.snapshot()["sbo_producer_launches"] == {(ran,): 2}


def test_served_masked_gemm_reaches_the_real_entry() -> None:
    """No stand-in: the real entry runs and refuses bf16 scales before any kernel launch."""
    down = _plugin_down_args(expected_m=32)
    x = torch.zeros(8, 256, 2048, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp32 block scales"):
        masked_gemm(lambda *a, **k: "deep_gemm", (x, x), (x, x), x, torch.zeros(8), 32,
                         overlap_args=down)
