"""The combine overlap per DeepEP tree, on CPU: the two real trees' signatures (vendored under
tests/fixtures/deep_ep_trees, read by the real probe), the kwargs each binds, the SMs the send
holds, and the signal layout each tree's kernel reads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from sglang_overlap.kernels.capabilities import combine_forms
from sglang_overlap.kernels.combine_overlap import (
    HYBRID_SEND_MAX_SMS,
    check_combine_call,
    check_layout_for_combine,
    combine_send_num_sms,
    layout_overlap_kwargs,
)
from sglang_overlap.kernels.down_gemm import combine_signal_layout
from sglang_overlap.kernels.package_source import package_version, probe_package, read_params
from sglang_overlap.kernels.signals import new_signal

TREES = Path(__file__).resolve().parents[1] / "fixtures" / "deep_ep_trees"
HYBRID, ANT = TREES / "hybrid-ep-94a9f8f", TREES / "antgroup-opt-76f0271"
# tree -> (version, the form it takes)
EXPECTED = {HYBRID: ("1.2.1+hybrid-ep.94a9f8f", "per_expert"),
            ANT: ("1.2.1+antgroup-opt.76f0271", "per_block")}


def _layout(form: str, e: int = 16, n: int = 256, w: int = 1, t: int = 128, em: int = 64):
    return combine_signal_layout(form, num_local_experts=e, world_size=w,  # type: ignore
                                 num_max_dispatch_tokens_per_rank=n, num_tokens=t, hidden=7168,
                                 expected_m=em, num_sms=132, comm_num_sms=3)


@pytest.mark.parametrize("tree", [HYBRID, ANT], ids=["hybrid-ep", "antgroup-opt"])
def test_real_trees_are_probed_with_version_and_form(tree: Path) -> None:
    version, form = EXPECTED[tree]
    found = probe_package("deep_ep", ("Buffer.low_latency_combine",), [str(tree)])
    assert found.version == version == package_version("deep_ep", [str(tree)])
    assert found.params is not None and "buffer.py" in found.params.where
    assert combine_forms(found.params) == (form,)


@pytest.mark.parametrize("tree", [HYBRID, ANT], ids=["hybrid-ep", "antgroup-opt"])
def test_each_tree_binds_only_its_form(tree: Path) -> None:
    _version, form = EXPECTED[tree]
    params = read_params("deep_ep", "Buffer.low_latency_combine", [str(tree)])
    assert params is not None
    for other in ("per_expert", "per_block"):
        lay = _layout(other)
        kwargs = layout_overlap_kwargs(other, lay, new_signal(lay, "cpu"),  # type: ignore
                                       torch.zeros(16, dtype=torch.int32), num_sms=3)
        if other == form:
            check_combine_call(params, kwargs)
        else:
            with pytest.raises(ValueError, match="does not accept"):
                check_combine_call(params, kwargs)


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch):
    def put(tree: Path) -> None:
        monkeypatch.syspath_prepend(str(tree))
        for name in [m for m in sys.modules if m == "deep_ep" or m.startswith("deep_ep.")]:
            monkeypatch.delitem(sys.modules, name)
    yield put
    for name in [m for m in sys.modules if m == "deep_ep" or m.startswith("deep_ep.")]:
        del sys.modules[name]


def test_start_up_names_a_tree_without_the_form(on_path) -> None:
    from benchmarks.harness.deepep import load_deep_ep

    on_path(HYBRID)
    with pytest.raises(RuntimeError) as err:
        load_deep_ep("per_block")
    text = str(err.value)
    assert "1.2.1+hybrid-ep.94a9f8f" in text and str(HYBRID) in text
    assert "per_expert" in text and "not per_block" in text and "antgroup-opt" in text


def test_start_up_names_a_tree_that_fails_to_load(on_path) -> None:
    from benchmarks.harness.deepep import load_deep_ep

    on_path(ANT)  # the fixture has no compiled extension: importing it fails like a bad .so
    with pytest.raises(RuntimeError, match=r"deep_ep 1\.2\.1\+antgroup-opt\.76f0271 at .* "
                                           r"does not load \(ModuleNotFoundError"):
        load_deep_ep("per_block")


def _hybrid_send_sms(num_experts: int, num_tokens: int) -> int:
    """hybrid-ep csrc/kernels/internode_ll.cu combine_overlappable(), send-only, verbatim."""
    num_device_sms = 32

    def ceil_div(a: int, b: int) -> int:
        return (a + b - 1) // b

    num_warp_groups = ceil_div(num_experts, num_device_sms)
    num_recv_per_sm = ceil_div(num_tokens, num_device_sms)
    return max(ceil_div(num_experts, num_warp_groups), ceil_div(num_tokens, num_recv_per_sm))


@pytest.mark.parametrize("e, t, want", [(16, 128, 32), (8, 1, 8), (8, 16, 16), (256, 128, 32),
                                        (32, 1, 32), (64, 7, 32)])
def test_hybrid_send_grid(e: int, t: int, want: int) -> None:
    assert combine_send_num_sms("per_expert", num_experts=e, num_tokens=t, comm_num_sms=3) == want
    assert _hybrid_send_sms(e, t) == want


def test_hybrid_send_grid_brute_force_never_exceeds_32() -> None:
    for e in range(1, 300, 7):
        for t in range(1, 1025, 13):
            got = combine_send_num_sms("per_expert", num_experts=e, num_tokens=t, comm_num_sms=3)
            assert got == _hybrid_send_sms(e, t) and got <= HYBRID_SEND_MAX_SMS, (e, t)
    assert combine_send_num_sms("per_block", num_experts=8, num_tokens=1, comm_num_sms=5) == 5


@pytest.mark.parametrize("e, n, w, em", [(16, 256, 1, 16), (16, 256, 1, 200), (8, 128, 2, 64),
                                         (32, 96, 4, 300)])
def test_per_block_layout_is_what_antgroup_reads(e: int, n: int, w: int, em: int) -> None:
    lay = _layout("per_block", e=e, n=n, w=w, em=em)
    cap = n * w  # antgroup-opt: num_signal_per_expert = ceil_div(num_ranks * N, block_m)
    assert lay.block_m == 64  # and its host asserts the length E * ceil(C / 64)
    assert lay.signal_shape == (e * -(-cap // 64),) and lay.signal_dtype == "int32"
    assert lay.expect_value == lay.n_tiles > 0 and lay.comm_num_sms == 3
    assert lay.compute_num_sms == 128  # 132 - 3, rounded down to even for DeepGEMM
    for exp in range(e):  # signal e * per_expert + b covers rows [b*block_m, (b+1)*block_m)
        for b in range(lay.blocks_per_expert):
            assert lay.signal_index(exp, b) == exp * -(-cap // lay.block_m) + b
    kw = layout_overlap_kwargs("per_block", lay, new_signal(lay, "cpu"),
                               torch.zeros(e, dtype=torch.int32), num_sms=3)
    assert (kw["block_m"], kw["threshold"], kw["num_sms"]) == (lay.block_m, lay.expect_value, 3)


def test_per_expert_layout_keeps_the_gemm_off_the_hybrid_send() -> None:
    lay = _layout("per_expert", t=1)
    assert lay.signal_shape == (16,) and lay.signal_dtype == "uint32"
    assert lay.comm_num_sms == HYBRID_SEND_MAX_SMS and lay.compute_num_sms == 100


def test_layouts_the_kernel_would_misread_are_refused() -> None:
    block = _layout("per_block")
    with pytest.raises(ValueError, match="granularity block"):
        check_layout_for_combine(block, "per_expert", num_max_dispatch_tokens_per_rank=256,
                                 num_ranks=1)
    with pytest.raises(ValueError, match=r"capacity 256 != .* = 512"):
        check_layout_for_combine(block, "per_block", num_max_dispatch_tokens_per_rank=256,
                                 num_ranks=2)
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout

    wide = plan_sbo_layout(num_local_experts=16, capacity=256, block_m=128, block_n=128,
                           hidden=7168, num_sms=132, comm_num_sms=4, granularity="block")
    with pytest.raises(ValueError, match="block_m 128.*64-row"):
        check_layout_for_combine(wide, "per_block", num_max_dispatch_tokens_per_rank=256,
                                 num_ranks=1)
    with pytest.raises(ValueError, match="is not the layout's"):
        layout_overlap_kwargs("per_block", block, torch.zeros(3, dtype=torch.int32),
                              torch.zeros(16, dtype=torch.int32), num_sms=3)
