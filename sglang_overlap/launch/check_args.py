"""Check each server's flags with SGLang's own parser and the plugin's validation.

The parser imports sglang (and torch): that happens in a child Python (`python -m
sglang_overlap.launch.check_args IN OUT`), so the launcher itself stays light and SGLang's
logging setup and usage dumps do not leak into it. On a machine without GPUs a GPU config is
checked as far as the parser goes (no device checks run while parsing).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from sglang_overlap.compat import SUPPORTED_SGLANG
from sglang_overlap.launch.commands import server_argv
from sglang_overlap.launch.config import ConfigError, LaunchConfig

_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")


def _argparse_error(text: str) -> str:
    """The `prog: error: ...` line of an argparse failure (the usage dump is dropped)."""
    for line in reversed(text.strip().splitlines()):
        if ": error: " in line:
            return line.split(": error: ", 1)[1]
    return text.strip().splitlines()[-1] if text.strip() else "rejected by SGLang's parser"


def _check_one(argv: list[str]) -> dict[str, object]:
    from sglang_overlap.settings import SettingsError
    from sglang_overlap.sglang.upstream.server_args import parse_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _, settings = parse_server_args(argv)
    except SystemExit:
        return {"error": _argparse_error(err.getvalue())}
    except SettingsError as exc:
        return {"error": str(exc).removeprefix("sglang-overlap: ")}
    except Exception as exc:  # noqa: BLE001 - any rejection of the flags is reported, not raised
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None, "settings": settings.to_dict()}


def main(argv: list[str]) -> int:
    jobs = json.loads(Path(argv[0]).read_text())
    results = {name: _check_one(list(args)) for name, args in jobs.items()}
    Path(argv[1]).write_text(json.dumps(results))
    return 0


def _blame(cfg: LaunchConfig, role: str, message: str) -> str:
    """The config key whose args hold the first flag `message` mentions."""
    sources = [(f"[{role}] args", cfg.role(role).args), ("[common] args", cfg.common_args)]
    for flag in _FLAG.findall(message):
        for key, args in sources:
            if any(a == flag or a.startswith(flag + "=") for a in args):
                return key
    return f"[{role}]"


def sglang_errors(
    cfgs: Sequence[LaunchConfig], env: Mapping[str, str] | None = None, timeout: float = 600.0
) -> list[str | None]:
    """Parse every server of every config as `sglang serve` would, in one child Python.

    Returns one entry per config: None, or the first error as "FILE: KEY: message" (KEY is the
    args list holding the flag the message names). Raises ConfigError if the parser cannot run.
    """
    jobs = {f"{i}:{r.name}": server_argv(cfg, r) for i, cfg in enumerate(cfgs) for r in cfg.servers}
    child_env = {**os.environ, **(dict(cfgs[0].common_env) if cfgs else {}), **(env or {})}
    with tempfile.TemporaryDirectory(prefix="sglang-overlap-check-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(jobs))
        proc = subprocess.run(
            [sys.executable, "-m", "sglang_overlap.launch.check_args", str(src), str(dst)],
            env=child_env, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if proc.returncode != 0 or not dst.is_file():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            where = ", ".join(str(c.path) for c in cfgs)
            raise ConfigError(
                f"{where}: could not run SGLang's parser (is sglang=={SUPPORTED_SGLANG} "
                f"installed in {sys.executable}?):\n{tail}"
            )
        results: dict[str, dict[str, object]] = json.loads(dst.read_text())
    errors: list[str | None] = [None] * len(cfgs)
    for key, res in results.items():
        i, role = int(key.split(":")[0]), key.split(":")[1]
        error = res.get("error")
        if error and errors[i] is None:
            errors[i] = f"{cfgs[i].path}: {_blame(cfgs[i], role, str(error))}: {error}"
    return errors


def check_server_flags(cfg: LaunchConfig, env: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError naming the file, the key and SGLang's or the plugin's message."""
    error = sglang_errors([cfg], env)[0]
    if error is not None:
        raise ConfigError(error)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
