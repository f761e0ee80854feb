"""How the supported SGLang lays a model's routed experts over the expert-parallel ranks,
redundant experts included, and which of them receive tokens.

SGLang's rules (`sglang.srt.eplb.expert_location`, `layers/moe/fused_moe_triton/layer.py`,
`arg_groups/parallel_hook.py`):
- Each MoE layer holds `num_physical_experts = routed + --ep-num-redundant-experts` expert slots
  (default 0 redundant), which must divide by `--ep-size`: every rank holds
  `num_physical_experts / ep_size` of them (`ExpertLocationMetadata._init_common`). DeepSeek-V3
  on EP 72 takes 32 redundant experts: 288 = 72 x 4.
- Which logical expert each slot holds comes from `--init-expert-location`: "trivial" (the
  default) puts logical expert `i % routed` in slot i (the redundant slots copy experts 0, 1, ...);
  a JSON / .pt mapping or expert counts (EPLB's placement) place them by load.
- Tokens reach a copy only through the replica dispatch (`ep_dispatch_algorithm`), which SGLang
  turns on by itself with `--enable-eplb` or a non-trivial `--init-expert-location`, or is asked
  for with `--ep-dispatch-algorithm`. Without it a token's logical expert id is its slot id:
  the redundant slots hold weights and receive nothing.
- `--enable-eplb` needs `--ep-size` > 1.

Redundant experts need neither EPLB nor a placement to start; they need one to be used.
Plain Python (no torch, no sglang); mypy --strict.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_overlap.planning.cost.profiles import Deployment, ModelProfile, ProfileError

TRIVIAL = "trivial"
"""--init-expert-location's default: logical expert i % routed in slot i."""

REDUNDANT_FLAG = "--ep-num-redundant-experts"
DISPATCH_CHOICES = ("static", "dynamic", "fake", "lp")
"""The supported SGLang's --ep-dispatch-algorithm choices."""


class ExpertLayoutError(ProfileError):
    """An expert-parallel layout SGLang would not start; the message names the flags and a fix."""


def replicas_dispatched(*, enable_eplb: bool = False, init_expert_location: str = TRIVIAL,
                        ep_dispatch_algorithm: str | None = None) -> bool:
    """Whether SGLang sends tokens to redundant copies: its `ep_dispatch_algorithm` resolves to
    one (`handle_eplb_and_dispatch`: --enable-eplb or a non-trivial --init-expert-location set
    it when it is not given)."""
    return (ep_dispatch_algorithm is not None or enable_eplb
            or init_expert_location != TRIVIAL)


def redundant_to_fit(routed: int, ep_size: int, near: int = 0) -> int:
    """The redundant-expert count closest to `near` (the smaller on a tie) that makes
    routed + redundant divide by `ep_size`."""
    low = (-routed) % ep_size
    if near <= low:
        return low
    below = low + (near - low) // ep_size * ep_size
    above = below + ep_size
    return below if near - below <= above - near else above


@dataclass(frozen=True)
class ExpertLayout:
    """One MoE layer's experts over the EP ranks (all counts per layer)."""

    routed: int  # the model's routed (logical) experts
    redundant: int = 0  # --ep-num-redundant-experts
    ep_size: int = 1
    replicas_used: bool = True  # tokens reach the redundant copies (see `replicas_dispatched`)

    @property
    def physical(self) -> int:
        """Expert slots of the layer: routed + redundant."""
        return self.routed + self.redundant

    @property
    def per_rank(self) -> int:
        """Expert slots each GPU holds (weights it stores, grouped-GEMM groups it runs)."""
        return max(1, self.physical // max(1, self.ep_size))

    @property
    def receiving(self) -> int:
        """Slots tokens are spread over: every slot when the copies are dispatched to, else
        only the routed experts' own slots."""
        return self.physical if self.replicas_used else self.routed

    def rows_per_expert(self, tokens_per_rank: float, topk: int) -> float:
        """Rows each expert of the busiest rank receives with balanced routing: every rank
        sends tokens x topk rows, spread evenly over the receiving slots."""
        return tokens_per_rank * topk * self.ep_size / self.receiving


def layout_of(model: ModelProfile, deploy: Deployment) -> ExpertLayout:
    """The layout the cost model prices (no divisibility check: `check_expert_layout` is the
    front door's)."""
    return ExpertLayout(model.num_experts, deploy.num_redundant_experts, deploy.ep_size,
                        deploy.redundant_experts_used)


EP_SPANNING_A2A = frozenset({"megamoe", "deepep", "deepep_v2", "mooncake", "nixl",
                             "ascend_fuseep", "flashinfer", "flashinfer_megamoe", "mori", "pplx",
                             "torch_a2a"})
"""--moe-a2a-backend values under which SGLang sets ep_size = tp_size
(`arg_groups/overrides._A2A_EP_SPANNING_BACKENDS`; the plugin's torch_a2a resolves to deepep)."""


def server_ep_size(ep_size: int, tp_size: int, a2a_backend: str) -> tuple[int, str]:
    """(the EP size SGLang serves with, how to name it in a message) from its flags."""
    if a2a_backend in EP_SPANNING_A2A:
        return tp_size, f"--ep-size {tp_size} (--tp-size, as --moe-a2a-backend {a2a_backend} sets)"
    return ep_size, f"--ep-size {ep_size}"


def check_expert_layout(routed: int, redundant: int, ep_size: int, *, model: str = "",
                        replicas_used: bool = True, ep_flag: str = "") -> ExpertLayout:
    """The layout, or ExpertLayoutError where SGLang would refuse it at start. `ep_flag` names
    the EP size in the message (default "--ep-size N")."""
    if redundant < 0:
        raise ExpertLayoutError(f"{REDUNDANT_FLAG} must be >= 0 (got {redundant})")
    if ep_size < 1:
        raise ExpertLayoutError(f"--ep-size must be >= 1 (got {ep_size})")
    physical = routed + redundant
    if physical % ep_size:
        of = f" of {model}" if model else ""
        fit = redundant_to_fit(routed, ep_size, near=redundant)
        raise ExpertLayoutError(
            f"{ep_flag or f'--ep-size {ep_size}'} must divide the {routed} routed + "
            f"{redundant} redundant "
            f"experts{of} ({REDUNDANT_FLAG} {redundant}); {REDUNDANT_FLAG} {fit} would make "
            f"{routed + fit} = {ep_size} GPUs x {(routed + fit) // ep_size} experts")
    return ExpertLayout(routed, redundant, ep_size, replicas_used)


def check_eplb(enable_eplb: bool, ep_size: int) -> None:
    """SGLang asserts ep_size > 1 under --enable-eplb (`handle_eplb_and_dispatch`)."""
    if enable_eplb and ep_size <= 1:
        raise ExpertLayoutError(f"--enable-eplb needs --ep-size > 1 (got {ep_size})")


def idle_replicas_note(layout: ExpertLayout) -> str:
    """Why the redundant experts get no tokens, or "" when they do (or there are none)."""
    if layout.redundant == 0 or layout.replicas_used:
        return ""
    return (f"the {layout.redundant} redundant experts get no tokens: with --init-expert-location "
            "trivial, no --enable-eplb and no --ep-dispatch-algorithm, SGLang routes each token "
            "to its logical expert's own slot")


__all__ = [
    "DISPATCH_CHOICES",
    "EP_SPANNING_A2A",
    "REDUNDANT_FLAG",
    "TRIVIAL",
    "ExpertLayout",
    "ExpertLayoutError",
    "check_eplb",
    "check_expert_layout",
    "idle_replicas_note",
    "layout_of",
    "redundant_to_fit",
    "replicas_dispatched",
    "server_ep_size",
]
