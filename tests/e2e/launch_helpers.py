"""Run `sglang-overlap launch` as a user would (a subprocess), for the e2e tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from sglang_overlap.launch.supervisor import LAUNCH_ID_ENV, pids_with_launch_id

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
READY_TIMEOUT = 660.0  # past the configs' ready_timeout (600 s): the launcher says why first


class LaunchRun:
    def __init__(self, name: str, config: Path, model: Path, env: dict[str, str], workdir: Path,
                 extra: tuple[str, ...] = ()) -> None:
        self.name, self.workdir = name, workdir
        self.launch_id = f"e2e-{name}-{uuid.uuid4().hex[:12]}"
        self.out_path = workdir / f"{name}.out"
        self.argv = [sys.executable, "-m", "sglang_overlap", "launch", str(config),
                     "--model-path", str(model), "--log-dir", str(workdir / f"{name}-logs"),
                     *extra]
        self.env = {**os.environ, **env, LAUNCH_ID_ENV: self.launch_id}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LaunchRun:
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=self.workdir, start_new_session=True)
        return self

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while "[launch] ready:" not in self.output():
            if self.proc.poll() is not None:
                pytest.fail(f"launch {self.name} exited {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"launch {self.name} not ready in {timeout} s:\n{self.output()}")
            time.sleep(1.0)

    def pid_of(self, role: str) -> int:
        m = re.search(rf"\[launch\] {role}: started pid (\d+)", self.output())
        assert m, self.output()
        return int(m.group(1))

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launch {self.name} still running after {timeout} s:\n{self.output()}")

    def strays(self) -> list[int]:
        return pids_with_launch_id(self.launch_id)

    def close(self) -> None:
        """Stop the launch (and anything it left) whatever state the test left it in."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.strays():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def single_server_config(workdir: Path, name: str, port: int, extra_args: list[str]) -> Path:
    """configs/tiny-cpu-single.toml on another port, with `extra_args` added to its args."""
    text = (CONFIGS / "tiny-cpu-single.toml").read_text()
    text = text.replace("port = 31010", f"port = {port}")
    if extra_args:  # appended to the one `args = [...]` list of the file
        text, n = re.subn(r"(\nargs = \[[^\]]*)\]", lambda m: m.group(1) + ", " +
                          json.dumps(extra_args)[1:], text, count=1)
        assert n == 1, "tiny-cpu-single.toml has no `args = [...]` list"
    path = workdir / f"{name}.toml"
    path.write_text(text)
    return path


def generate(url: str, text: str, max_new_tokens: int, timeout: float = 300.0) -> dict[str, Any]:
    payload = {"text": text, "sampling_params": {"temperature": 0,
                                                 "max_new_tokens": max_new_tokens}}
    req = urllib.request.Request(f"{url}/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out
