"""What the gate believes before it has measured: each candidate mode's predicted step time.

Two priors, same interface (`candidates(phase)` and `predictions(phase, busiest, mean)`):
- `CostModelPrior`: the cost model (`cost_model.predict`) for the served model, on a GPU
  profile, cached per (phase, busiest rank's tokens, mean tokens) bucket (`token_bucket`: exact
  below 64 tokens, then 16 steps per power of two), so a steady workload costs a dict lookup.
- `FlatPrior`: no opinion (every candidate predicted equal); ties go to no overlap, and the
  gate's measurements decide. What `--overlap-hardware-profile auto` means where no GPU profile
  applies (a CPU, or a GPU without a shipped profile).

Candidates: decode runs none, TBO, SBO (whichever are enabled); prefill runs none and the TBO
split, labelled "tbo" (whether a request is cut in two chunks is TBO's own plan, per batch).
Prefill TBO is priced as balanced halves (the cost model's two_chunk): only token counts are
shared between ranks, not sequence lengths. Every candidate gets a price: one the cost model finds
inapplicable at the deployment (SBO at one expert rank: nothing to hide) is priced as no overlap,
which is what the cost model charges it, so ties go to none and the gate's measurements decide
(the server runs it; a missing price would stop the scheduler at the first step).
Plain Python; mypy --strict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol

from sglang_overlap.modes import CANDIDATES, ENABLABLE, PHASES, Mode, Phase, phase_of
from sglang_overlap.planning.cost.cost_model import predict
from sglang_overlap.planning.cost.profiles import Deployment, HardwareProfile, ModelProfile

_CACHE_LIMIT = 4096


def token_bucket(tokens: int) -> int:
    """Round up to the cache granularity: exact below 64, then 16 steps per power of two."""
    if tokens < 64:
        return max(0, tokens)
    step = 1 << max(0, tokens.bit_length() - 5)
    return -(-tokens // step) * step


def candidate_modes(phase: Phase, enabled: frozenset[Mode]) -> tuple[Mode, ...]:
    """The modes the gate chooses among in `phase`, as labelled in its decisions
    (`modes.CANDIDATES`)."""
    return (Mode.NONE, *(m for m, by in CANDIDATES[phase_of(phase)].items() if enabled & by))


def check_enabled(enabled: frozenset[Mode]) -> frozenset[Mode]:
    unknown = sorted(set(enabled) - ENABLABLE)
    if unknown:
        raise ValueError(f"Gate: unknown modes {unknown}; enable a subset of "
                         f"{sorted(m.value for m in ENABLABLE)}")
    return frozenset(Mode(m) for m in enabled)


class Prior(Protocol):
    name: str
    enabled: frozenset[Mode]

    def candidates(self, phase: Phase) -> tuple[Mode, ...]: ...

    def predictions(self, phase: Phase, busiest: int, mean: float) -> Mapping[Mode, float]:
        """Predicted step time (us) of every candidate mode (`candidates(phase)`, each one)
        at this load."""
        ...


class FlatPrior:
    """Every candidate predicted equal (1 us): the measurements alone decide."""

    def __init__(self, enabled: frozenset[Mode], why: str = "no hardware profile") -> None:
        self.enabled = check_enabled(enabled)
        self.name = f"flat ({why})"
        self._flat = {p: dict.fromkeys(candidate_modes(p, self.enabled), 1.0)
                      for p in PHASES}

    def candidates(self, phase: Phase) -> tuple[Mode, ...]:
        return tuple(self._flat[phase])

    def predictions(self, phase: Phase, busiest: int, mean: float) -> Mapping[Mode, float]:
        return self._flat[phase]


class CostModelPrior:
    """The cost model's prediction for the served model on one hardware profile."""

    def __init__(self, model: ModelProfile, hw: HardwareProfile, deploy: Deployment,
                 enabled: frozenset[Mode]) -> None:
        self.model, self.hw, self.deploy = model, hw, deploy
        self.enabled = check_enabled(enabled)
        self.name = f"cost model ({model.name} on {hw.name})"
        self._cands = {p: candidate_modes(p, self.enabled) for p in PHASES}
        self._cache: dict[tuple[Phase, int, int], dict[Mode, float]] = {}

    def candidates(self, phase: Phase) -> tuple[Mode, ...]:
        return self._cands[phase]

    def predictions(self, phase: Phase, busiest: int, mean: float) -> Mapping[Mode, float]:
        key = (phase, token_bucket(busiest), token_bucket(int(mean + 0.5)))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        tokens = key[1]
        if phase == Phase.DECODE:
            per_seq = self.deploy.tokens_per_seq
            tokens = max(per_seq, -(-tokens // per_seq) * per_seq)
        deploy = dataclasses.replace(self.deploy, tokens_per_gpu=max(1, tokens),
                                     phase=phase_of(phase))
        # The cost model names the prefill split two_chunk (balanced halves); the selector
        # labels it tbo.
        modes = [Mode.TWO_CHUNK if m == Mode.TBO and phase == Phase.PREFILL else m
                 for m in self._cands[phase]]
        pred = predict(self.model, self.hw, deploy, modes, moe_tokens=float(max(1, key[2])),
                       timelines=False)
        label = dict(zip(modes, self._cands[phase], strict=True))
        # an inapplicable mode's estimate is the cost model's price of no overlap (its note says
        # why): the gate explores and measures it like any other candidate
        result = {label[m]: e.step_us for m, e in pred.estimates.items()}
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = result
        return result


__all__ = ["CostModelPrior", "FlatPrior", "Prior", "candidate_modes",
           "check_enabled", "token_bucket"]
