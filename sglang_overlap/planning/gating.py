"""Automatic gating (--overlap-gating auto): per step, run the enabled mode predicted fastest.

Every data-parallel rank must run the same mode in the same step (their all-to-alls pair up), so
`Gate.decide` sees only what all ranks share after SGLang's DP synchronisation: the phase and the
all-gathered per-rank token counts. Its hysteresis state (the mode it is in, per phase) changes
only as a function of that shared sequence of inputs, so ranks that start together and see the
same steps decide the same modes, step after step.

Hysteresis: the gate leaves its current mode only for one predicted at least `hysteresis` (a
fraction) faster, so a workload hovering at a break-even point does not flap.

Cost: predictions are cached per (phase, busiest rank's tokens, mean tokens) after rounding both
to a bucket (exact below 64 tokens, then 1/16 of the power of two), so a steady workload costs
one dict lookup per step. Plain Python; mypy --strict.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sglang_overlap.planning.cost.cost_model import predict
from sglang_overlap.planning.cost.profiles import Deployment, HardwareProfile, ModelProfile

logger = logging.getLogger("sglang_overlap.gating")

Mode = Literal["none", "tbo", "sbo", "two_chunk"]
GatePhase = Literal["decode", "prefill"]
ENABLABLE = frozenset({"tbo", "sbo", "two_chunk"})
_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class GateDecision:
    mode: Mode
    predicted_us: Mapping[str, float]  # step time of each candidate mode (none included)
    reason: str


def token_bucket(tokens: int) -> int:
    """Round up to the cache granularity: exact below 64, then 16 steps per power of two."""
    if tokens < 64:
        return max(0, tokens)
    step = 1 << max(0, tokens.bit_length() - 5)
    return -(-tokens // step) * step


HYSTERESIS_FLAG = "--overlap-gating-hysteresis"


def check_hysteresis(hysteresis: float) -> None:
    """Raise ValueError unless 0 <= hysteresis <= 0.5."""
    if not (isinstance(hysteresis, (int, float)) and 0.0 <= hysteresis <= 0.5):
        raise ValueError(f"{HYSTERESIS_FLAG} must be in [0, 0.5] (got {hysteresis!r})")


class Gate:
    """Chooses a mode per step from shared data; one instance per rank, fed the same inputs."""

    def __init__(self, model: ModelProfile, hw: HardwareProfile, deploy: Deployment,
                 enabled: frozenset[str], hysteresis: float) -> None:
        unknown = sorted(set(enabled) - ENABLABLE)
        if unknown:
            raise ValueError(f"Gate: unknown modes {unknown}; enable a subset of "
                             f"{sorted(ENABLABLE)}")
        check_hysteresis(hysteresis)
        self.model, self.hw, self.deploy = model, hw, deploy
        self.enabled = frozenset(enabled)
        self.hysteresis = hysteresis
        self._current: dict[str, str] = {}
        self._cache: dict[tuple[str, int, int], dict[str, float]] = {}

    def _candidates(self, phase: str) -> tuple[str, ...]:
        if phase == "decode":
            return ("none", *(m for m in ("tbo", "sbo") if m in self.enabled))
        # Prefill: only token counts are shared, not sequence lengths, so the split is priced as
        # balanced halves (what two-chunk guarantees; plain TBO gets it when boundaries allow).
        return ("none", "two_chunk") if self.enabled & {"tbo", "two_chunk"} else ("none",)

    def _label(self, phase: str, mode: str) -> str:
        if phase == "prefill" and mode == "two_chunk" and "two_chunk" not in self.enabled:
            return "tbo"
        return mode

    def predictions(self, phase: GatePhase, busiest: int, mean: float) -> dict[str, float]:
        """Predicted step time (us) per candidate mode for this load (cached by bucket)."""
        key = (phase, token_bucket(busiest), token_bucket(int(mean + 0.5)))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        tokens = key[1]
        if phase == "decode":
            per_seq = self.deploy.tokens_per_seq
            tokens = max(per_seq, -(-tokens // per_seq) * per_seq)
        deploy = dataclasses.replace(self.deploy, phase=phase, tokens_per_gpu=max(1, tokens))
        modes = self._candidates(phase)
        pred = predict(self.model, self.hw, deploy, modes, moe_tokens=float(max(1, key[2])),
                       timelines=False)
        result = {self._label(phase, m): e.step_us for m, e in pred.estimates.items()
                  if e.applicable}
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = result
        return result

    def decide(self, phase: GatePhase, global_tokens_per_rank: Sequence[int]) -> GateDecision:
        """The mode for this step. `global_tokens_per_rank`: every DP rank's token count (the
        all-gathered `global_num_tokens`), identical on all ranks."""
        if phase not in ("decode", "prefill"):
            raise ValueError(f"Gate.decide: phase must be decode or prefill (got {phase!r})")
        busiest = max(global_tokens_per_rank, default=0)
        if busiest <= 0:
            return GateDecision("none", {}, "idle step: every rank has 0 tokens")
        mean = sum(global_tokens_per_rank) / len(global_tokens_per_rank)
        predicted = self.predictions(phase, busiest, mean)
        best = min(predicted, key=lambda m: (predicted[m], m != "none"))
        current = self._current.get(phase)
        if current not in predicted:
            chosen, why = best, "first step of this phase" if current is None else \
                f"{current} does not apply"
        elif best == current:
            chosen, why = current, "still the fastest"
        elif predicted[best] <= predicted[current] * (1.0 - self.hysteresis):
            chosen, why = best, f"beats {current} by more than {self.hysteresis:.0%}"
        else:
            chosen, why = current, f"{best} is within the {self.hysteresis:.0%} hysteresis"
        self._current[phase] = chosen
        times = ", ".join(f"{m}={t / 1e3:.2f}ms" for m, t in sorted(predicted.items()))
        reason = (f"{phase} busiest={busiest} mean={mean:.1f} tokens/rank: {chosen} ({why}); "
                  f"predicted step {times}")
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("overlap gating: %s", reason)
        return GateDecision(chosen, predicted, reason)  # type: ignore[arg-type]
