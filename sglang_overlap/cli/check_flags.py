"""The server flags `sglang-overlap check` answers for, read fast when SGLang need not be imported.

`sglang serve`'s parser lives in `sglang.srt.server_args`, whose import takes 6 s or more on a
small machine. Most questions to `check` use only the flags that decide the overlap paths:
the plugin's own, the four SGLang flags the plugin reads, and a handful of SGLang's layout flags
(`SGLANG_SUBSET`). `parse_fast` reads an argv made only of those with a parser that copies
SGLang's option strings, types, choices and defaults (a test compares them with SGLang's own
parser), and returns None for anything else; `parse_with_sglang` then runs SGLang's parser with
the plugin loaded, with SGLang's usage text (500 lines) kept off the terminal: a rejected flag is
one `FlagError` line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import typing
from typing import Any

from sglang_overlap.planning.cost.experts import DISPATCH_CHOICES
from sglang_overlap.settings import OverlapSettings, SettingsError, add_arguments

A2A_CHOICES = ("none", "deepep", "mooncake", "nixl", "mori", "ascend_fuseep", "flashinfer",
               "megamoe", "deepep_v2", "pplx", "ascend_tp", "flashinfer_megamoe", "torch_a2a")
"""The supported SGLang's --moe-a2a-backend choices, plus the plugin's torch_a2a."""

RUNNER_CHOICES = ("auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm",
                  "experimental_sgl_trtllm", "flashinfer_trtllm_routed", "flashinfer_cutlass",
                  "flashinfer_mxfp4", "flashinfer_cutedsl", "flashinfer_megamoe", "cutlass",
                  "aiter", "marlin", "humming", "experimental_sgl_marlin", "lora_cutedsl",
                  "lora_triton", "lora_marlin", "hpc_ops", "megamoe", "intel_xpu")
"""The supported SGLang's --moe-runner-backend choices."""

# (option strings as SGLang spells them, argparse keywords): the supported SGLang's definitions
SGLANG_SUBSET: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--model-path", "--model"), {"type": str, "default": None, "required": True}),
    (("--revision",), {"type": str, "default": None}),
    (("--trust-remote-code",), {"action": "store_true"}),
    (("--device",), {"type": str, "default": None}),
    (("--tp-size", "--tensor-parallel-size", "--tp"), {"type": int, "default": 1}),
    (("--dp-size", "--data-parallel-size", "--dp"), {"type": int, "default": 1}),
    (("--attn-dp-size", "--attention-data-parallel-size"), {"type": int, "default": 1}),
    (("--ep-size", "--expert-parallel-size", "--ep"), {"type": int, "default": 1}),
    (("--nnodes",), {"type": int, "default": 1}),
    (("--enable-dp-attention",), {"action": "store_true"}),
    (("--moe-a2a-backend",), {"type": str, "default": "none", "choices": A2A_CHOICES}),
    (("--deepep-mode",), {"type": str, "default": "auto",
                          "choices": ("auto", "normal", "low_latency")}),
    (("--moe-runner-backend",), {"type": str, "default": "auto", "choices": RUNNER_CHOICES}),
    (("--ep-num-redundant-experts",), {"type": int, "default": 0}),
    (("--init-expert-location",), {"type": str, "default": "trivial"}),
    (("--enable-eplb",), {"action": "store_true"}),
    (("--ep-dispatch-algorithm",), {"type": str, "default": None,
                                    "choices": DISPATCH_CHOICES}),
)
"""The SGLang flags `parse_fast` knows. `--tp` and `--dp` are not option strings of SGLang's
parser: argparse there takes them as unambiguous prefixes of `--tp-size` / `--dp-size`."""


class FlagError(ValueError):
    """Server flags that `sglang serve` would refuse: one line, naming the flag."""


class _Raising(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise FlagError(message)


def fast_parser() -> argparse.ArgumentParser:
    """The plugin's flags and `SGLANG_SUBSET`, no abbreviations, errors raised as FlagError."""
    p = _Raising(prog="sglang serve", add_help=False, allow_abbrev=False)
    for names, kwargs in SGLANG_SUBSET:
        p.add_argument(*names, **kwargs)
    add_arguments(p, include_upstream=True)
    return p


def _known(argv: list[str], parser: argparse.ArgumentParser) -> bool:
    options = parser._option_string_actions  # noqa: SLF001 - argparse has no public view
    return all(not tok.startswith("-") or tok.split("=", 1)[0] in options or _number(tok)
               for tok in argv)


def _number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def parse_fast(argv: list[str]) -> argparse.Namespace | None:
    """`argv` read without SGLang (None when a flag is not one the fast parser knows).
    Raises FlagError for a bad value of a flag it knows."""
    parser = fast_parser()
    if not _known(argv, parser):
        return None
    ns, rest = parser.parse_known_args(argv)
    if rest:
        raise FlagError(f"unrecognized arguments: {' '.join(rest)}")
    return ns


def parse_with_sglang(argv: list[str]) -> Any:
    """A ServerArgs exactly as `sglang serve` parses `argv` with the plugin loaded (the plugin's
    `check_settings` included). Raises FlagError (SGLang's parser, one line: its usage text is
    dropped) or SettingsError (the plugin's validation)."""
    from sglang_overlap.sglang.upstream.server_args import parse_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            server_args, _ = parse_server_args(list(argv))
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if "error:" in line]
        why = lines[-1].split("error:", 1)[1].strip() if lines else f"exit status {exc.code}"
        raise FlagError(f"{why} (SGLang's parser)") from None
    return server_args


def one_line(exc: FlagError | SettingsError) -> str:
    """The error without the plugin's own name in front (the command line names it)."""
    return str(exc).removeprefix("sglang-overlap: ")


def settings_of(values: Any) -> OverlapSettings:
    """The plugin settings a parsed namespace or ServerArgs carries."""
    from sglang_overlap.sglang.state import settings_of as carried

    if isinstance(values, argparse.Namespace):
        return OverlapSettings.from_mapping(vars(values))
    return carried(values)
