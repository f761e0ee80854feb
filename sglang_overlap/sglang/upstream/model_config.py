"""Hook on `sglang.srt.configs.model_config`: the served model's architecture checked against
the modes asked for, where the launcher could not read its config.json before start-up (a model
not downloaded yet).

`ModelConfig.from_server_args` (AFTER) runs in the launcher (the tokenizer manager) and in every
scheduler, before any weight loads: a mode not proven on the architecture (`sglang_overlap.models`)
stops the server there with the SettingsError the command line gives. Draft models (speculative
decoding) are not checked: the served architecture is the target model's.
"""

from __future__ import annotations

from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import HookSpec

FROM_SERVER_ARGS = "sglang.srt.configs.model_config.ModelConfig.from_server_args"


def after_from_server_args(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    if kwargs.get("is_draft_model"):
        return
    from sglang_overlap.models import requested_modes
    from sglang_overlap.sglang.upstream.server_args import refuse_model

    settings = state.settings_of(server_args)
    if not requested_modes(settings):
        return
    hf_config = getattr(result, "hf_config", None)
    config = hf_config.to_dict() if hf_config is not None and hasattr(hf_config, "to_dict") else {}
    refuse_model(config, settings, str(getattr(result, "model_path", "")))


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(FROM_SERVER_ARGS, after_from_server_args, "after",
             "refuse a mode not proven on the served architecture when the config is read",
             "src:4905163949a7", feature=Feature.ARGS),
)
