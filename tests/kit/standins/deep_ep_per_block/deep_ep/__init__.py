"""Test-only stand-in for DeepEP's antgroup-opt tree (76f0271) on torch.distributed: the
per-block overlap form (`overlap, packed_recv_count, comp_signal, block_m, threshold,
num_sms`). The signatures of
`Buffer.low_latency_dispatch` / `low_latency_combine` and of the normal-mode calls
(`get_dispatch_config`, `get_combine_config`, `get_dispatch_layout`, `dispatch`, `combine`) are that
tree's, verbatim (tests/fixtures/deep_ep_trees/antgroup-opt-76f0271); the bodies are
`sglang_cpu_shim.deep_ep_gloo` and `deep_ep_normal` (contracts there)."""

from typing import Callable, List, Optional, Tuple, Union

import torch
from sglang_cpu_shim.deep_ep_gloo import BufferBase, Config, EventOverlap

__version__ = '1.2.1+antgroup-opt.76f0271'  # the fixture tree's local build tag
__all__ = ["Buffer", "Config", "EventOverlap"]


class Buffer(BufferBase):
    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms, 24, 256, 6, 128)  # the trees' entry for 2 ranks

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms, 10, 256, 6, 128)  # the trees' entry for 2 ranks

    # noinspection PyTypeChecker
    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int,
                            previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                            allocate_on_comm_stream: bool = False) -> \
            Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, torch.Tensor, EventOverlap]:
        return self._normal_layout(topk_idx, num_experts)

    # noinspection PyTypeChecker
    def dispatch(self, x: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
                 handle: Optional[Tuple] = None,
                 num_tokens_per_rank: Optional[torch.Tensor] = None, num_tokens_per_rdma_rank: Optional[torch.Tensor] = None,
                 is_token_in_rank: Optional[torch.Tensor] = None, num_tokens_per_expert: Optional[torch.Tensor] = None,
                 topk_idx: Optional[torch.Tensor] = None, topk_weights: Optional[torch.Tensor] = None,
                 expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config: Optional[Config] = None,
                 previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False) -> \
            Tuple[Union[Tuple[torch.Tensor, torch.Tensor], torch.Tensor], Optional[torch.Tensor],
                  Optional[torch.Tensor], List[int], Tuple, EventOverlap]:
        return self._normal_dispatch(x, handle, is_token_in_rank, num_tokens_per_expert,
                                     topk_idx, topk_weights, expert_alignment,
                                     num_worst_tokens)

    # noinspection PyTypeChecker
    def combine(self, x: torch.Tensor, handle: Tuple,
                topk_weights: Optional[torch.Tensor] = None,
                bias: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]] = None,
                config: Optional[Config] = None,
                previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False) -> \
            Tuple[torch.Tensor, Optional[torch.Tensor], EventOverlap]:
        return self._normal_combine(x, handle, topk_weights, bias)

    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor,
                             num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                             dispatch_wait_recv_cost_stats: Optional[torch.Tensor] = None,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False) -> \
            Tuple[Tuple[torch.Tensor, torch.Tensor], torch.Tensor, Tuple, "EventOverlap", Callable]:
        return self._ll.dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                                 use_fp8=use_fp8, round_scale=round_scale)

    # noinspection PyTypeChecker
    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, handle: tuple,
                            overlap: bool = False, packed_recv_count: torch.Tensor = None, comp_signal: torch.Tensor = None,
                            block_m: int = 64, threshold: int = 0, num_sms: int = 3,
                            use_logfmt: bool = False, zero_copy: bool = False, async_finish: bool = False,
                            return_recv_hook: bool = False, out: Optional[torch.Tensor] = None,
                            combine_wait_recv_cost_stats: Optional[torch.Tensor] = None) -> \
            Tuple[torch.Tensor, "EventOverlap", Callable]:
        return self._ll.combine(
            x, topk_idx, topk_weights, handle, overlap=overlap, form="per_block", out=out,
            packed_recv_count=packed_recv_count, comp_signal=comp_signal, block_m=block_m,
            threshold=threshold)
