"""Glue to SGLang 0.5.23: the only package that imports sglang (never the oracle or the harness).

One file per upstream module hooked (what a maintainer diffs when SGLang is upgraded):
    server_args.py           sglang.srt.server_args: the flags, validation, torch_a2a resolution
    two_batch_overlap.py     ...batch_overlap.two_batch_overlap: TBO / two-chunk split decisions
    operations.py            ...batch_overlap.operations: the TBO step marker around upstream
    operations_strategy.py   ...batch_overlap.operations_strategy: CPU prefill strategy
    dp_attn.py               ...managers.scheduler_components.dp_attn: the mode selector per step
    model_runner.py          ...model_executor.model_runner: selector built at start, steps timed
    internal_state.py        ...managers.scheduler_components.internal_state: table, counters
    request_receiver.py      ...managers.scheduler_components.request_receiver: selector
                             measurements ride the request broadcast
    forward_batch_info.py    ...model_executor.forward_batch_info: CPU padding fill value
    deepep_dispatcher.py     ...layers.moe.token_dispatcher.deepep: torch_a2a impls, SBO combine
    ep_moe.py                ...layers.moe.ep_moe.layer: torch_a2a experts
    moe_utils.py             ...layers.moe.utils: the SBO path decision, SM90 refusal lifted
    single_batch_overlap.py  ...batch_overlap.single_batch_overlap: the SBO signal layout
    deep_gemm_wrapper.py     ...layers.deep_gemm_wrapper.entrypoint: the SBO down GEMM
    deepseek_v2.py           ...models.deepseek_v2: SBO only in a step whose mode is SBO
    decode_cuda_graph_runner.py  ...model_executor.runner.decode_cuda_graph_runner: a decode
                             graph set per overlap mode under the mode selector
    metrics_collector.py     ...observability.metrics_collector: the plugin's /metrics series
Shared by them:
    hooks.py         HookSpec, the list of glue modules, registration
    guard.py         the SGLang version / hook-target check run by register()
    state.py         the one settings reader, the TBO-step marker, the step's mode, SM counts
    sbo_decision.py  the SBO path of this process (from the installed kernels)
    selector_setup.py    the mode selector (--overlap-gating auto) built at start-up: its prior
    selector_runtime.py  the selector's step times and how they reach every rank
    torch_a2a.py     the torch_a2a dispatcher impls
"""
