"""Launch configurations: a TOML file naming the model, the servers and the router.

    [model]
    path = "${MODEL_PATH:-deepseek-ai/DeepSeek-V3-0324}"   # ${VAR} / ${VAR:-default} expand
    [common]                    # flags and environment for every server
    args = ["--trust-remote-code"]
    env = { SGLANG_HOST_IP = "127.0.0.1" }
    [prefill]                   # with [decode]: PD disaggregation behind [router]
    host = "0.0.0.0"            # bind address; `addr` = how the router reaches it (default host)
    port = 30000
    bootstrap_port = 8998
    args = ["--enable-two-batch-overlap", ...]
    [decode]
    port = 30001
    args = ["--enable-single-batch-overlap", ...]
    [router]
    port = 8000
    args = ["--prometheus-port", "29000"]
    [launch]
    ready_timeout = 1800        # seconds until every server and the router must be ready

Or a single `[server]` table instead of prefill/decode/router. The launcher owns the flags it
derives from these tables (--model-path, --host, --port, --disaggregation-mode,
--disaggregation-bootstrap-port, --node-rank; the router's --pd-disaggregation, --prefill,
--decode): setting them in `args` is an error, as is a flag in both [common] and a role.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef,import-not-found]

SERVER_ROLES = ("prefill", "decode", "server")
ROLE_KEYS = {"host", "addr", "port", "args", "env"}
TABLE_KEYS: dict[str, set[str]] = {
    "model": {"path"},
    "common": {"args", "env"},
    "prefill": ROLE_KEYS | {"bootstrap_port"},
    "decode": ROLE_KEYS,
    "server": ROLE_KEYS,
    "router": ROLE_KEYS,
    "launch": {"ready_timeout"},
}
SERVER_OWNED = ("--model-path", "--host", "--port", "--disaggregation-mode",
                "--disaggregation-bootstrap-port", "--node-rank")
ROUTER_OWNED = ("--host", "--port", "--pd-disaggregation", "--prefill", "--decode",
                "--worker-urls")
DEFAULT_PORTS = {"prefill": 30000, "decode": 30001, "server": 30000, "router": 8000}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """A config that cannot be launched; the message names the file and the key."""


@dataclass(frozen=True)
class Role:
    name: str
    host: str
    port: int
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    addr: str = ""
    """How others reach this role (the router, health checks)."""
    bootstrap_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.addr or self.host}:{self.port}"

    @property
    def nnodes(self) -> int:
        return int(flag_value(self.args, "--nnodes") or 1)


@dataclass(frozen=True)
class LaunchConfig:
    path: Path
    model_path: str
    common_args: tuple[str, ...]
    common_env: Mapping[str, str]
    servers: tuple[Role, ...]
    """(prefill, decode) or (server,)."""
    router: Role | None
    ready_timeout: float = 1800.0

    @property
    def disaggregated(self) -> bool:
        return self.router is not None

    def role(self, name: str) -> Role:
        for r in (*self.servers, *([self.router] if self.router else [])):
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.servers) + (("router",) if self.router else ())


def flag_value(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value of `flag` in `args` (either `--flag v` or `--flag=v`), or None."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def flags_in(args: tuple[str, ...]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


class _Reader:
    """Typed access to the raw TOML, with errors that name file and key."""

    def __init__(self, path: Path, raw: dict[str, Any], environ: Mapping[str, str]) -> None:
        self.path, self.raw, self.environ = path, raw, environ

    def fail(self, key: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {msg}")

    def expand(self, key: str, value: str) -> str:
        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in self.environ:
                return self.environ[name]
            if default is not None:
                return default
            hint = f"export it or write ${{{name}:-default}}"
            raise self.fail(key, f"${{{name}}} is not set ({hint})")

        return _VAR.sub(sub, value)

    def table(self, name: str) -> dict[str, Any] | None:
        t = self.raw.get(name)
        if t is None:
            return None
        if not isinstance(t, dict):
            raise self.fail(f"[{name}]", f"must be a table (got {type(t).__name__})")
        unknown = sorted(set(t) - TABLE_KEYS[name])
        if unknown:
            raise self.fail(f"[{name}] {unknown[0]}",
                            f"unknown key (known: {', '.join(sorted(TABLE_KEYS[name]))})")
        return t

    def string(self, t: dict[str, Any], table: str, key: str, default: str | None = None) -> str:
        v = t.get(key, default)
        if not isinstance(v, str) or v == "":
            raise self.fail(f"[{table}] {key}", f"must be a non-empty string (got {v!r})")
        return self.expand(f"[{table}] {key}", v)

    def port(self, t: dict[str, Any], table: str, key: str, default: int | None) -> int:
        v = t.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
            raise self.fail(f"[{table}] {key}", f"must be an integer port in 1..65535 (got {v!r})")
        return v

    def args(self, t: dict[str, Any], table: str) -> tuple[str, ...]:
        v = t.get("args", [])
        if not isinstance(v, list):
            raise self.fail(f"[{table}] args", f"must be a list of strings (got {v!r})")
        out = []
        for i, a in enumerate(v):
            if isinstance(a, bool) or not isinstance(a, str | int | float):
                raise self.fail(f"[{table}] args[{i}]", f"must be a string or number (got {a!r})")
            out.append(self.expand(f"[{table}] args", str(a)))
        return tuple(out)

    def env(self, t: dict[str, Any], table: str) -> dict[str, str]:
        v = t.get("env", {})
        if not isinstance(v, dict):
            raise self.fail(f"[{table}] env", f"must be a table of strings (got {v!r})")
        for k, x in v.items():
            if not isinstance(x, str):
                raise self.fail(f"[{table}] env.{k}", f"must be a string (got {x!r})")
        return {k: self.expand(f"[{table}] env.{k}", x) for k, x in v.items()}


def _role(r: _Reader, name: str, t: dict[str, Any], default_host: str) -> Role:
    host = r.string(t, name, "host", default_host)
    addr = r.string(t, name, "addr", "127.0.0.1" if host in ("0.0.0.0", "::") else host)
    args = r.args(t, name)
    owned = ROUTER_OWNED if name == "router" else SERVER_OWNED
    for flag in sorted(flags_in(args) & set(owned)):
        what = "set by the launcher from the config" if flag != "--model-path" else "[model] path"
        raise r.fail(f"[{name}] args", f"{flag} is {what}; remove it from args")
    bootstrap = r.port(t, name, "bootstrap_port", 8998) if name == "prefill" else None
    return Role(name=name, host=host, port=r.port(t, name, "port", DEFAULT_PORTS[name]),
                args=args, env=r.env(t, name), addr=addr, bootstrap_port=bootstrap)


def _check_contradictions(r: _Reader, cfg: LaunchConfig) -> None:
    common = flags_in(cfg.common_args)
    for flag in sorted(common & set(SERVER_OWNED)):
        raise r.fail("[common] args", f"{flag} is set by the launcher from the config; remove it")
    for role in cfg.servers:
        both = sorted(common & flags_in(role.args))
        if both:
            raise r.fail(f"[{role.name}] args",
                         f"{both[0]} is also in [common] args; set it in one place")
    used: dict[tuple[str, int], str] = {}
    roles = [*cfg.servers, *([cfg.router] if cfg.router else [])]
    for role in roles:
        ports = [("port", role.port)] + (
            [("bootstrap_port", role.bootstrap_port)] if role.bootstrap_port else [])
        for key, port in ports:
            where = (role.addr, port)
            if where in used:
                raise r.fail(f"[{role.name}] {key}",
                             f"port {port} on {role.addr} is already {used[where]}")
            used[where] = f"[{role.name}] {key}"
    for role in cfg.servers:
        raw = flag_value(role.args, "--nnodes") or "1"
        if not raw.isdigit() or int(raw) < 1:
            raise r.fail(f"[{role.name}] args",
                         f"--nnodes must be a positive integer (got {raw!r})")
        nnodes = role.nnodes
        if nnodes > 1 and flag_value(role.args, "--dist-init-addr") is None:
            raise r.fail(f"[{role.name}] args", f"--nnodes {nnodes} needs --dist-init-addr")


def load_config(
    path: str | Path, *, model_path: str | None = None, environ: Mapping[str, str] | None = None
) -> LaunchConfig:
    """Read and check `path`. `model_path` overrides [model] path. Raises ConfigError."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: no such config file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    r = _Reader(p, raw, os.environ if environ is None else environ)
    unknown = sorted(set(raw) - set(TABLE_KEYS))
    if unknown:
        raise r.fail(f"[{unknown[0]}]", f"unknown table (known: {', '.join(TABLE_KEYS)})")
    model = r.table("model") or {}
    if model_path is None and "path" not in model:
        raise r.fail("[model] path", "missing (or pass --model-path)")
    mpath = model_path if model_path is not None else r.string(model, "model", "path")
    common = r.table("common") or {}
    tables = {n: r.table(n) for n in (*SERVER_ROLES, "router")}
    pd = tables["prefill"] is not None or tables["decode"] is not None
    if pd and tables["server"] is not None:
        raise r.fail("[server]", "contradicts [prefill]/[decode]: use one server or a PD pair")
    if pd and (tables["prefill"] is None or tables["decode"] is None):
        missing = "decode" if tables["decode"] is None else "prefill"
        raise r.fail(f"[{missing}]", "missing: PD disaggregation needs [prefill] and [decode]")
    if not pd and tables["server"] is None:
        raise r.fail("[server]", "missing: give [server], or [prefill] and [decode]")
    if not pd and tables["router"] is not None:
        raise r.fail("[router]", "needs [prefill] and [decode] (a single [server] has no router)")
    names = ("prefill", "decode") if pd else ("server",)
    servers = tuple(_role(r, n, tables[n] or {}, "127.0.0.1") for n in names)
    router = _role(r, "router", tables["router"] or {}, "127.0.0.1") if pd else None
    launch = r.table("launch") or {}
    timeout = launch.get("ready_timeout", 1800)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise r.fail("[launch] ready_timeout", f"must be a positive number (got {timeout!r})")
    cfg = LaunchConfig(path=p, model_path=mpath, common_args=r.args(common, "common"),
                       common_env=r.env(common, "common"), servers=servers, router=router,
                       ready_timeout=float(timeout))
    _check_contradictions(r, cfg)
    return cfg
