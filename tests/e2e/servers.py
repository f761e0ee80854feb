"""Start one real SGLang server on this CPU, talk to it, stop it (for the e2e tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited {self.proc.returncode}:\n"
                                   f"{self.log_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server {self.name} not healthy after {READY_TIMEOUT} s:\n"
                                   f"{self.log_text()[-4000:]}")
            time.sleep(2.0)
        return self

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
