"""Start one real SGLang server on this CPU, talk to it, stop it (for the e2e tests)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

READY_TIMEOUT = 420.0  # a --tp 2 server on 2 shared cores can take minutes to come up


class Server:
    """One `sglang serve` process group. Every server sleeps when idle (--sleep-on-idle): an idle
    SGLang scheduler otherwise spins, ~1.4 of this machine's 2 cores per --tp 2 server, and the
    servers a test runs side by side would be timed against that load."""

    def __init__(self, name: str, model: Path, port: int, flags: list[str],
                 env: dict[str, str], log_dir: Path) -> None:
        self.name, self.port = name, port
        self.log = log_dir / f"{name}.log"
        sglang = Path(sys.executable).with_name("sglang")
        self.argv = [str(sglang), "serve", "--model-path", str(model), "--device", "cpu",
                     "--host", "127.0.0.1", "--port", str(port), "--attention-backend",
                     "torch_native", "--max-total-tokens", "16384", "--sleep-on-idle", *flags]
        self.env = {**os.environ, **env}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        return self.start().wait_ready()

    def start(self) -> Server:
        """Spawn the server and return at once (`wait_ready` waits for it): servers that load
        side by side overlap their start-ups, which are mostly sleeping and file reads."""
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)
        self.started = time.monotonic()
        return self

    def wait_ready(self) -> Server:
        """Wait until the started server answers /health_generate (READY_TIMEOUT from start)."""
        assert self.proc is not None, f"server {self.name}: wait_ready before start"
        deadline = self.started + READY_TIMEOUT
        while not self._healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited {self.proc.returncode}:\n"
                                   f"{self.log_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server {self.name} not healthy after {READY_TIMEOUT} s:\n"
                                   f"{self.log_text()[-4000:]}")
            time.sleep(2.0)
        return self

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server's live processes (its process group) have used
        so far, from /proc."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        ticks = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.proc.pid:  # pgrp: start_new_session made it ours
                    ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def kill(self) -> None:
        """SIGKILL the server's process group now (a crashed SGLang server can take a minute to
        notice on its own)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health_generate", timeout=30) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def generate(self, texts: list[str], max_new_tokens: int) -> list[list[int]]:
        """Greedy token ids for each text, sent as one request (one batch at the server)."""
        body = {"text": texts, "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}
        req = urllib.request.Request(f"{self.url}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out: Any = json.loads(r.read())
        return [o["output_ids"] for o in out]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def one_after_another(servers: list[Server], ahead: int = 1) -> Iterator[Server]:
    """Each server, ready, in order; while the caller uses one, the next `ahead` ones load
    (each stopped when the caller moves past it, all on exit). For servers whose answers are
    compared, not timed: a loading server takes CPU from the one in use."""
    with contextlib.ExitStack() as stack:
        for i, server in enumerate(servers):
            for later in servers[i:i + 1 + ahead]:
                if later.proc is None:
                    stack.callback(later.__exit__, None, None, None)
                    later.start()
            yield server.wait_ready()
            server.__exit__(None, None, None)
