"""Agreement of planning/cost/experts.py with SGLang 0.5.23's own code, run on the CPU: its
expert-slot arithmetic (`eplb/expert_location.py`), its resolution of the replica dispatch
(`arg_groups/parallel_hook.handle_eplb_and_dispatch`), its logical-to-physical remap, and its
parser's flags (which `plan` copies)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from sglang_overlap.planning.cost.experts import (
    DISPATCH_CHOICES,
    ExpertLayoutError,
    check_eplb,
    check_expert_layout,
    replicas_dispatched,
)
from tests.conftest import require_module

location = require_module("sglang.srt.eplb.expert_location",
                          reason="sglang 0.5.23 is not importable here")
import torch  # noqa: E402
from sglang.srt.arg_groups.model_override_base import resolved_view  # noqa: E402
from sglang.srt.arg_groups.parallel_hook import handle_eplb_and_dispatch  # noqa: E402
from sglang.srt.eplb.expert_location_dispatch import topk_ids_logical_to_physical  # noqa: E402


def sglang_layout(physical: int, ep: int) -> tuple[int, int] | None:
    """(slots, slots per rank) as SGLang computes them for a fixed EP size, None where it
    asserts (ExpertLocationMetadata._init_common's divisibility)."""
    try:
        return location._compute_elastic_expert_layout(physical, ep, ep)
    except AssertionError:
        return None


@pytest.mark.parametrize("routed", [256, 160, 128, 64])
def test_experts_per_gpu_as_sglang_computes_them(routed: int) -> None:
    for ep in range(1, 300):
        for redundant in (0, 8, 16, 32, 64, ep - routed % ep):
            theirs = sglang_layout(routed + redundant, ep)
            try:
                layout = check_expert_layout(routed, redundant, ep)
            except ExpertLayoutError:
                assert theirs is None, f"{routed=} {redundant=} {ep=} {theirs=}"
                continue
            assert theirs == (layout.physical, layout.per_rank), f"{routed=} {redundant=} {ep=}"


def test_the_published_ep72_layout() -> None:
    assert sglang_layout(256 + 32, 72) == (288, 4)
    assert sglang_layout(256, 72) is None
    assert sglang_layout(256, 32) == (256, 8)


def _parse(argv: list[str]) -> Any:
    from sglang_overlap.sglang.upstream.server_args import parse_server_args

    server_args, _ = parse_server_args(["--model-path", "m", *argv])
    return server_args


@pytest.mark.parametrize("argv", [
    [],
    ["--ep-num-redundant-experts", "32"],
    ["--enable-eplb"],
    ["--init-expert-location", "/placements/logical_count.json"],
    ["--ep-dispatch-algorithm", "dynamic"],
    ["--enable-eplb", "--ep-dispatch-algorithm", "fake"],
    ["--moe-a2a-backend", "none", "--enable-eplb"],
])
def test_the_copies_get_tokens_when_sglang_resolves_a_dispatch(argv: list[str]) -> None:
    args = _parse(["--tp", "2", "--ep", "2", "--moe-a2a-backend", "deepep", *argv])
    handle_eplb_and_dispatch(args)
    theirs = resolved_view(args).ep_dispatch_algorithm is not None
    ours = replicas_dispatched(enable_eplb=args.enable_eplb,
                               init_expert_location=args.init_expert_location,
                               ep_dispatch_algorithm=args.ep_dispatch_algorithm)
    assert ours is theirs, argv


def test_enable_eplb_without_expert_parallelism_is_refused_by_both() -> None:
    args = _parse(["--enable-eplb"])
    with pytest.raises(AssertionError):
        handle_eplb_and_dispatch(args)
    with pytest.raises(ExpertLayoutError):
        check_eplb(args.enable_eplb, args.ep_size)


def test_without_a_dispatch_the_logical_id_is_the_slot() -> None:
    """With no dispatch info SGLang keeps the router's logical ids as slot ids: only the first
    `routed` slots ever get tokens, the redundant ones never do."""
    ids = torch.randint(0, 256, (64, 8))
    assert torch.equal(topk_ids_logical_to_physical(ids, None), ids)


def test_plans_flags_are_sglangs() -> None:
    from sglang.srt.server_args import ServerArgs

    from sglang_overlap.cli import plan as plan_cli

    theirs = argparse.ArgumentParser()
    ServerArgs.add_cli_args(theirs)
    sub = argparse.ArgumentParser().add_subparsers()
    plan_cli.add_parser(sub, "plan", "")
    plan = sub.choices["plan"]
    for flag in ("--ep-num-redundant-experts", "--init-expert-location", "--enable-eplb",
                 "--ep-dispatch-algorithm"):
        a, b = plan._option_string_actions[flag], theirs._option_string_actions[flag]
        assert (a.type, a.default, a.nargs, a.const, type(a)) == (
            b.type, b.default, b.nargs, b.const, type(b)), flag
        assert (a.choices is None) == (b.choices is None), flag
    assert list(theirs._option_string_actions["--ep-dispatch-algorithm"].choices) == list(
        DISPATCH_CHOICES)
