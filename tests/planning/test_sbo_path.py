"""The SBO decision table: hand-worked cases, then every combination against a reference."""

from __future__ import annotations

import itertools

import pytest

from sglang_overlap.planning.sbo_path import (
    Capabilities,
    SboPath,
    SboRequest,
    decide_sbo_path,
)

RELEASED = Capabilities(arch="sm90", deep_ep_version="0.1.2.post1",
                        deep_ep_combine_forms=("per_expert",), deep_gemm_version="0.2.3.post2",
                        deep_gemm_signal=False, plugin_signal_gemm=True)


def _caps(**kw: object) -> Capabilities:
    base = RELEASED.__dict__ | kw
    return Capabilities(**base)  # type: ignore[arg-type]


def test_released_wheels_on_hopper_pick_per_expert() -> None:
    d = decide_sbo_path(RELEASED, SboRequest())
    assert d.ok and d.path is SboPath.PER_EXPERT, d
    assert (d.granularity, d.combine_form, d.gemm_signal_source) == ("expert", "per_expert",
                                                                     "plugin")
    assert d.down_gemm_overlap


def test_no_triton_degrades_to_shared_expert_only_and_says_why() -> None:
    d = decide_sbo_path(_caps(plugin_signal_gemm=False), SboRequest())
    assert d.path is SboPath.SHARED_EXPERT_ONLY and d.ok
    assert "triton" in d.reason and "0.2.3.post2" in d.reason


def test_forced_overlap_without_signal_gemm_is_refused_naming_package_and_version() -> None:
    d = decide_sbo_path(_caps(plugin_signal_gemm=False), SboRequest(down_gemm_overlap="force"))
    assert not d.ok and d.path is None
    assert d.refusal is not None
    for needle in ("--sbo-down-gemm-overlap force", "sgl-deep-gemm 0.2.3.post2",
                   "pip install triton", "sgl-deep-ep 0.1.2.post1"):
        assert needle in d.refusal, (needle, d.refusal)


@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_a_triton_too_old_for_the_signal_gemm_is_named_in_the_refusal(granularity: str) -> None:
    too_old = "the signal store does not build on triton 3.3.1: pip install triton==3.8.0"
    caps = _caps(plugin_signal_gemm=False, plugin_signal_gemm_problem=too_old,
                 deep_ep_combine_forms=("per_expert", "per_block"))
    d = decide_sbo_path(caps, SboRequest(granularity=granularity))  # type: ignore[arg-type]
    assert d.refusal is not None and too_old in d.refusal, d
    assert "pip install triton;" not in d.refusal, d.refusal  # not the missing-triton text


def test_block_granularity_on_released_deep_ep_is_refused() -> None:
    d = decide_sbo_path(RELEASED, SboRequest(granularity="block"))
    assert d.refusal is not None
    assert "sgl-deep-ep 0.1.2.post1" in d.refusal and "comp_signal" in d.refusal


def test_per_block_deep_ep_and_deep_gemm_signal_pick_fine_grained() -> None:
    caps = _caps(deep_ep_combine_forms=("per_block",), deep_gemm_signal=True,
                 plugin_signal_gemm=False)
    d = decide_sbo_path(caps, SboRequest())
    assert (d.path, d.gemm_signal_source, d.combine_form) == (SboPath.FINE_GRAINED, "deep_gemm",
                                                              "per_block")


def test_no_deep_ep_is_refused_with_install_hint() -> None:
    d = decide_sbo_path(_caps(deep_ep_version=None, deep_ep_combine_forms=()), SboRequest())
    assert d.refusal is not None and "pip install sgl-deep-ep==0.1.2.post1" in d.refusal


def test_cpu_is_refused_and_points_at_assume_arch() -> None:
    d = decide_sbo_path(_caps(arch="cpu"), SboRequest())
    assert d.refusal is not None and "--assume-arch sm90" in d.refusal


def test_off_and_disabled() -> None:
    assert decide_sbo_path(RELEASED, SboRequest(enabled=False)).path is SboPath.OFF
    d = decide_sbo_path(RELEASED, SboRequest(down_gemm_overlap="off"))
    assert d.path is SboPath.SHARED_EXPERT_ONLY and not d.down_gemm_overlap


def test_non_deep_gemm_runner_on_hopper() -> None:
    assert decide_sbo_path(RELEASED, SboRequest(runner_backend="triton")).path is (
        SboPath.SHARED_EXPERT_ONLY)
    d = decide_sbo_path(RELEASED, SboRequest(runner_backend="triton", granularity="expert"))
    assert d.refusal is not None and "--moe-runner-backend deep_gemm" in d.refusal
    assert "(got triton)" in d.refusal


def test_blackwell_keeps_upstream() -> None:
    caps = _caps(arch="sm100")
    assert decide_sbo_path(caps, SboRequest()).path is SboPath.UPSTREAM_BLACKWELL
    assert decide_sbo_path(caps, SboRequest(granularity="block")).refusal is not None
    d = decide_sbo_path(caps, SboRequest(down_gemm_overlap="force"))
    assert d.refusal is not None and "flashinfer_cutedsl" in d.refusal


# --- every combination against a reference written as the table -------------------

def _reference(caps: Capabilities, req: SboRequest) -> SboPath | None:
    if not req.enabled:
        return SboPath.OFF
    forced = req.down_gemm_overlap == "force" or req.granularity != "auto"
    if req.a2a_backend != "deepep":
        return None if forced else SboPath.SHARED_EXPERT_ONLY
    if caps.arch not in ("sm90", "sm100") or caps.deep_ep_version is None:
        return None
    if caps.arch == "sm100":
        if req.granularity == "block":
            return None
        if req.down_gemm_overlap == "force" and not (
                req.runner_backend == "flashinfer_cutedsl"
                and "per_expert" in caps.deep_ep_combine_forms):
            return None
        return SboPath.UPSTREAM_BLACKWELL
    if req.down_gemm_overlap == "off":
        return SboPath.SHARED_EXPERT_ONLY
    deep_gemm_runner = req.runner_backend in ("auto", "deep_gemm")
    fine = (deep_gemm_runner and "per_block" in caps.deep_ep_combine_forms
            and (caps.deep_gemm_signal or caps.plugin_signal_gemm))
    expert = (deep_gemm_runner and "per_expert" in caps.deep_ep_combine_forms
              and caps.plugin_signal_gemm)
    candidates = {"auto": [(fine, SboPath.FINE_GRAINED), (expert, SboPath.PER_EXPERT)],
                  "block": [(fine, SboPath.FINE_GRAINED)],
                  "expert": [(expert, SboPath.PER_EXPERT)]}[req.granularity]
    for ok, path in candidates:
        if ok:
            return path
    return None if forced else SboPath.SHARED_EXPERT_ONLY


FORMS = [(), ("per_expert",), ("per_block",), ("per_block", "per_expert")]


@pytest.mark.parametrize("arch", ["sm90", "sm100", "cpu"])
def test_every_combination_matches_reference(arch: str) -> None:
    count = 0
    for forms, dg_sig, plugin, dep_ver in itertools.product(
            FORMS, [False, True], [False, True], ["0.1.2.post1", None]):
        caps = Capabilities(arch=arch, deep_ep_version=dep_ver,  # type: ignore[arg-type]
                            deep_ep_combine_forms=forms if dep_ver else (),  # type: ignore
                            deep_gemm_version="0.2.3.post2", deep_gemm_signal=dg_sig,
                            plugin_signal_gemm=plugin)
        for enabled, dgo, gran, a2a, runner in itertools.product(
                [True, False], ["auto", "force", "off"], ["auto", "expert", "block"],
                ["deepep", "torch_a2a"], ["auto", "deep_gemm", "triton", "flashinfer_cutedsl"]):
            if dgo == "off" and gran != "auto":
                continue  # rejected earlier by settings.validate_settings
            req = SboRequest(enabled=enabled, down_gemm_overlap=dgo,  # type: ignore[arg-type]
                             granularity=gran, a2a_backend=a2a,  # type: ignore[arg-type]
                             runner_backend=runner)
            got = decide_sbo_path(caps, req)
            want = _reference(caps, req)
            assert got.path == want, f"{caps=} {req=} {got=} {want=}"
            assert (got.refusal is None) == (want is not None), f"{caps=} {req=} {got=}"
            if got.refusal is not None:
                assert got.refusal.strip(), f"{caps=} {req=}"
            count += 1
    assert count > 1000
