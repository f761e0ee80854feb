"""`sglang-overlap args`: the plugin's server flags.

`sglang serve --help` prints its help before SGLang loads plugins, so the plugin's flags do not
appear there (`python -m sglang.launch_server --help` does load plugins first and shows them).
This command prints them, generated from the same `OverlapSettings` the server parses.
"""

from __future__ import annotations

import argparse
import json

from sglang_overlap.settings import OverlapSettings, add_arguments, flag_name, upstream_fields


def _flags_parser() -> argparse.ArgumentParser:
    upstream = [flag_name(f.name) for f in upstream_fields()]
    parser = argparse.ArgumentParser(
        prog="sglang serve",
        usage="sglang serve --model-path MODEL [SGLang flags] [sglang-overlap flags]",
        description="Server flags read by the sglang-overlap plugin. Those marked (SGLang) are "
        f"SGLang's own flags ({', '.join(upstream)}), with the same meaning; the plugin reads "
        "them.",
        add_help=False,
    )
    add_arguments(parser, include_upstream=True)
    for action in parser._actions:  # noqa: SLF001 - argparse has no public view
        if any(opt in upstream for opt in action.option_strings):
            action.help = f"(SGLang) {action.help}"
    return parser


def add_parser(subparsers: argparse._SubParsersAction, name: str, help: str) -> None:
    p = subparsers.add_parser(name, help=help, description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the flags and defaults as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json:
        defaults = OverlapSettings().to_dict()
        print(json.dumps({flag_name(k): v for k, v in defaults.items()}, indent=2))
        return 0
    _flags_parser().print_help()
    return 0
