"""The exact command, environment and readiness check of every process a config starts."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sglang_overlap.compat import SUPPORTED_SGLANG
from sglang_overlap.launch.config import LaunchConfig, Role


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables set on top of the launcher's own environment."""
    health_url: str | None = None
    """GET answers 200 when the process is ready (None: ready once started)."""
    router_workers: tuple[str, ...] = ()
    """For the router: worker URLs that GET /workers must list before it is ready."""

    def shell(self) -> str:
        """A copy-pasteable line: `env K=V ... argv`."""
        env = [f"{k}={v}" for k, v in self.env.items()]
        return shlex.join((["env", *env] if env else []) + list(self.argv))


INSTALL = {"sglang": f"sglang=={SUPPORTED_SGLANG}", "smg": "smg"}
"""What to pip-install for each program a launch runs."""


def _executable(name: str) -> str:
    """The `name` script of this Python's environment, else the one on PATH, else the bare name:
    a dry run prints it as is, and a launch refuses to start (`program_missing`)."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    return shutil.which(name) or name


def program_missing(spec: ProcessSpec) -> str | None:
    """Why `spec`'s program cannot be started (one line), or None when it can."""
    program = spec.argv[0]
    if os.sep in program:
        found = Path(program).is_file() and os.access(program, os.X_OK)
    else:
        found = shutil.which(program) is not None
    if found:
        return None
    hint = f" (pip install {INSTALL[program]})" if program in INSTALL else ""
    return f"{spec.name}: '{program}' not found next to {sys.executable} or on PATH{hint}"


def server_argv(cfg: LaunchConfig, role: Role, node_rank: int = 0) -> list[str]:
    """Flags after `sglang serve` (what SGLang's parser sees)."""
    argv = ["--model-path", cfg.model_path, "--host", role.host, "--port", str(role.port),
            *cfg.common_args, *role.args]
    if cfg.disaggregated:
        argv += ["--disaggregation-mode", role.name]
    if role.bootstrap_port is not None:
        argv += ["--disaggregation-bootstrap-port", str(role.bootstrap_port)]
    if role.nnodes > 1:
        argv += ["--node-rank", str(node_rank)]
    return argv


def server_spec(cfg: LaunchConfig, role: Role, node_rank: int = 0) -> ProcessSpec:
    argv = (_executable("sglang"), "serve", *server_argv(cfg, role, node_rank))
    # Only node 0 of a multi-node server runs the HTTP server.
    health = f"{role.url}/health" if node_rank == 0 else None
    return ProcessSpec(role.name, argv, {**cfg.common_env, **role.env}, health)


def router_spec(cfg: LaunchConfig) -> ProcessSpec:
    router = cfg.router
    if router is None:
        raise ValueError(f"{cfg.path}: no router in a single-server config")
    prefill, decode = cfg.role("prefill"), cfg.role("decode")
    argv = (_executable("smg"), "launch", "--host", router.host, "--port", str(router.port),
            "--pd-disaggregation", "--prefill", prefill.url, str(prefill.bootstrap_port),
            "--decode", decode.url, *router.args)
    return ProcessSpec("router", argv, dict(router.env), f"{router.url}/workers",
                       (prefill.url, decode.url))


def process_specs(
    cfg: LaunchConfig, roles: tuple[str, ...] | None = None, node_rank: int = 0
) -> list[ProcessSpec]:
    """Specs of the selected roles (all by default), servers first, router last."""
    chosen = cfg.role_names if roles is None else roles
    for name in chosen:
        if name not in cfg.role_names:
            raise ValueError(f"{cfg.path}: no role {name!r} (roles: {', '.join(cfg.role_names)})")
    for r in cfg.servers:
        if r.name in chosen and r.nnodes > 1 and not 0 <= node_rank < r.nnodes:
            raise ValueError(f"--node-rank {node_rank}: [{r.name}] runs on {r.nnodes} nodes "
                             f"(ranks 0..{r.nnodes - 1})")
    specs = [server_spec(cfg, r, node_rank if r.nnodes > 1 else 0)
             for r in cfg.servers if r.name in chosen]
    if "router" in chosen:
        specs.append(router_spec(cfg))
    return specs
