"""`sglang-overlap` entry point: one module per subcommand, imported only when it runs.

Each subcommand module defines `add_parser(subparsers) -> None` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line summary). Modules are imported lazily so that `sglang-overlap plan`
# never pays for importing torch or sglang.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("sglang_overlap.cli.plan", "predict each overlap mode's time for a deployment"),
    "check": ("sglang_overlap.cli.check", "readiness report for this machine and these flags"),
    "args": ("sglang_overlap.cli.args", "print the plugin's server flags"),
    "launch": ("sglang_overlap.cli.launch", "start prefill/decode servers + router from a config"),
    "gsm8k": ("sglang_overlap.cli.gsm8k", "few-shot GSM8K accuracy against a running server"),
    "bench": ("sglang_overlap.cli.bench", "SGLang's serving benchmark on one or more servers, "
              "with ratios and CIs"),
    "gate": ("sglang_overlap.cli.gate", "the step times a server's automatic gating learned"),
}


def version_line() -> str:
    """`sglang-overlap X (for sglang Y)`: this package's version and the one SGLang it hooks."""
    from sglang_overlap import __version__
    from sglang_overlap.compat import SUPPORTED_SGLANG

    return f"sglang-overlap {__version__} (for sglang {SUPPORTED_SGLANG})"


def build_parser(names: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-overlap",
        description="MoE communication/computation overlap for SGLang (TBO, two-chunk, SBO).",
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in names if names is not None else SUBCOMMANDS:
        module_name, summary = SUBCOMMANDS[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # subcommand not shipped in this build
        module.add_parser(sub, name=name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Import only the chosen subcommand's module (plus all of them for bare --help).
    chosen = [argv[0]] if argv and argv[0] in SUBCOMMANDS else None
    if argv[:1] == ["--version"]:
        chosen = []  # nothing to import to answer
    parser = build_parser(chosen)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
