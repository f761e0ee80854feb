"""Hook on `sglang.srt.managers.scheduler_components.request_receiver`: the mode selector's
measurements ride the request broadcast SGLang already does at the start of every scheduler
iteration.

`SchedulerRequestReceiver._broadcast_reqs_across_ranks` (AROUND), with --overlap-gating auto and no
attention DP (`selector_runtime.py`, transport `broadcast`): the TP leader (the rank that pulls
requests) appends its new step times (`SelectorShare`) to the list it broadcasts to the other TP
ranks, once --overlap-gating-sync-steps selector calls have passed, preferably to a list that
carries requests (`SelectorRuntime.outgoing`); on every rank the share is taken out of the received
list (so the scheduler never sees it) and merged into the selector, at the same broadcast on every
rank. The broadcast runs anyway; on a list that carries requests a share adds a few pickled
integers, on an empty one (a size message only) a second message (on CPU about 0.9 ms of waiting
for the other rank), which is why shares prefer lists that carry requests. No
collective.
"""

from __future__ import annotations

from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.sglang import selector_setup
from sglang_overlap.sglang.hooks import HookSpec
from sglang_overlap.sglang.selector_runtime import SelectorShare

BROADCAST_REQS = ("sglang.srt.managers.scheduler_components.request_receiver."
                  "SchedulerRequestReceiver._broadcast_reqs_across_ranks")


def broadcast_reqs(orig: Any, self: Any, recv_reqs: Any, local_reqs: Any = None) -> Any:
    rt = selector_setup.runtime()
    if rt is None or rt.transport != "broadcast":
        return orig(self, recv_reqs, local_reqs)
    if recv_reqs is not None:  # this rank pulled the requests: the leader
        share = rt.outgoing(riding=bool(recv_reqs or local_reqs))
        if share is not None:
            recv_reqs = [*recv_reqs, share]
    out = orig(self, recv_reqs, local_reqs)
    if not out:
        return out
    shares = [r for r in out if isinstance(r, SelectorShare)]  # upstream appends local_reqs
    if not shares:
        return out
    for share in shares:
        rt.incoming(share)
    return [r for r in out if not isinstance(r, SelectorShare)]


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(BROADCAST_REQS, broadcast_reqs, "around",
             "--overlap-gating auto: the TP leader's step times ride the request broadcast",
             "src:5a828ff98b44", feature=Feature.GATE),
)
