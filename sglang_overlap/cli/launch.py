"""`sglang-overlap launch CONFIG`: start the servers and the router a config describes.

    sglang-overlap launch configs/h200-pd-deepseek-v3.toml
    sglang-overlap launch configs/tiny-cpu-pd.toml --model-path /tmp/tiny-dsv3 --dry-run
    sglang-overlap launch configs/h20-pd-deepseek-r1.toml --only decode --node-rank 1  # node 1

Prefill and decode start together; the router starts once both answer /health and is ready
when GET /workers lists both. Every child logs to its own file under --log-dir. Ctrl-C (or
SIGTERM), or the death of any child, stops all of them and says which one failed and why.
Exit codes: 0 dry run, 1 a program is not installed or a child failed or was not ready in time,
2 bad config, 130/143 stopped by SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sglang_overlap.launch.check_args import check_server_flags
from sglang_overlap.launch.commands import ProcessSpec, process_specs, program_missing
from sglang_overlap.launch.config import ConfigError, LaunchConfig, load_config
from sglang_overlap.launch.supervisor import (
    LAUNCH_ID_ENV,
    LaunchFailed,
    Stopped,
    Supervisor,
)

PROG = "sglang-overlap launch"


def add_parser(subparsers: Any, name: str, help: str) -> None:
    p = subparsers.add_parser(name, help=help, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="CONFIG", help="a TOML launch config (see configs/)")
    p.add_argument("--model-path", default=None, help="override the config's [model] path")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config and print the exact commands, start nothing")
    p.add_argument("--log-dir", default=None,
                   help="where each process logs (default: ./sglang-overlap-logs/CONFIG-TIME)")
    p.add_argument("--only", default=None, metavar="ROLES",
                   help="comma-separated roles to start on this machine (default: all), "
                   "e.g. 'decode' on the second node of a multi-node decode server")
    p.add_argument("--node-rank", type=int, default=0,
                   help="this machine's --node-rank for multi-node roles (default: 0)")
    p.add_argument("--ready-timeout", type=float, default=None,
                   help="seconds to wait for readiness (default: the config's, else 1800)")
    p.add_argument("--no-validate", action="store_true",
                   help="skip checking server flags with SGLang's parser (saves ~10-40 s)")
    p.set_defaults(func=run)


def _error(msg: str) -> None:
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)


def _prepare(args: argparse.Namespace) -> tuple[LaunchConfig, list[ProcessSpec]]:
    cfg = load_config(args.config, model_path=args.model_path)
    roles = tuple(r.strip() for r in args.only.split(",")) if args.only else None
    try:
        specs = process_specs(cfg, roles, args.node_rank)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if not args.no_validate:
        print(f"[launch] checking server flags with SGLang's parser ({cfg.path})",
              file=sys.stderr, flush=True)
        check_server_flags(cfg)
    return cfg, specs


def _run_all(sup: Supervisor, cfg: LaunchConfig, specs: list[ProcessSpec],
             timeout: float) -> None:
    servers = [sup.start(s) for s in specs if s.name != "router"]
    sup.wait_ready(servers, timeout)
    routers = [sup.start(s) for s in specs if s.name == "router"]
    sup.wait_ready(routers, timeout)
    entry = cfg.router.url if cfg.router is not None else cfg.servers[0].url
    local = ", ".join(f"{c.spec.name} pid {c.proc.pid}" for c in sup.children)
    sup.say(f"ready: send requests to {entry} ({local}); logs in {sup.log_dir}; "
            "Ctrl-C stops everything")
    sup.watch()


def run(args: argparse.Namespace) -> int:
    try:
        cfg, specs = _prepare(args)
    except ConfigError as exc:
        _error(str(exc))
        return 2
    except KeyboardInterrupt:  # Ctrl-C while SGLang's parser runs: nothing started yet
        _error("interrupted before anything was started")
        return 130
    if args.dry_run:
        for spec in specs:
            ready = (f"GET {spec.health_url} lists {', '.join(spec.router_workers)}"
                     if spec.router_workers else f"GET {spec.health_url} answers 200")
            print(f"# {spec.name}: ready when {ready if spec.health_url else 'started'}")
            print(spec.shell())
        return 0
    missing = [m for m in map(program_missing, specs) if m is not None]
    if missing:  # found out now, not after the servers took minutes to come up
        for message in missing:
            _error(message)
        _error("nothing was started")
        return 1
    stamp = time.strftime("%Y%m%d-%H%M%S")
    default_dir = Path("sglang-overlap-logs") / f"{Path(args.config).stem}-{stamp}"
    log_dir = Path(args.log_dir) if args.log_dir else default_dir
    launch_id = os.environ.get(LAUNCH_ID_ENV) or uuid.uuid4().hex
    sup = Supervisor(log_dir.resolve(), launch_id)
    sup.install_signal_handlers()
    timeout = args.ready_timeout if args.ready_timeout is not None else cfg.ready_timeout
    try:
        _run_all(sup, cfg, specs, timeout)
    except Stopped as exc:
        sup.say(f"received {exc}: stopping everything")
        sup.stop_all()
        return 128 + exc.signum
    except LaunchFailed as exc:
        _error(str(exc))
        sup.stop_all()
        _error("stopped every process of this launch")
        return 1
    finally:
        # Whatever happened (even an unexpected exception), leave nothing running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sup.stop_all(grace_s=5.0)
    return 0  # not reached: watch() only returns by raising
