"""Hook on `sglang.srt.model_executor.forward_batch_info` (CPU only): torch_native attention has no
`get_cpu_graph_seq_len_fill_value`, which SGLang asks for when it pads a batch for the
attention-TP scatter that every a2a backend needs."""

from __future__ import annotations

from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.sglang.hooks import HookSpec

PAD_INPUTS = "sglang.srt.model_executor.forward_batch_info.ForwardBatch._pad_inputs_to_size"


class _FillValueBackend:
    """An attention backend seen through, plus the CPU padding fill value SGLang asks for."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    @staticmethod
    def get_cpu_graph_seq_len_fill_value() -> int:
        return 1  # what SGLang's CPU backends (intel_amx) use: a padded sequence of length 1


class _RunnerView:
    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self.attn_backend = _FillValueBackend(runner.attn_backend)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


def pad_inputs_to_size(orig: Any, self: Any, model_runner: Any, *args: Any, **kwargs: Any) -> Any:
    if not hasattr(model_runner.attn_backend, "get_cpu_graph_seq_len_fill_value"):
        model_runner = _RunnerView(model_runner)
    return orig(self, model_runner, *args, **kwargs)


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(PAD_INPUTS, pad_inputs_to_size, "around",
             "CPU: torch_native attention lacks the padding fill value a2a batches need",
             "src:dff480b8eb0d", feature=Feature.TORCH_A2A, cpu_only=True),
)
