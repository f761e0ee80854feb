"""Start one real SGLang server on this CPU, talk to it, stop it (for the e2e tests)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
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
        self._stopping: threading.Thread | None = None

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
            time.sleep(0.5)  # refused at once until the HTTP server is up, then one token
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
        """Stop the server and wait until it is gone (joins a `stop_in_background`)."""
        if self._stopping is not None:
            self._stopping.join()
            return
        self._terminate()

    @property
    def stopping(self) -> bool:
        """Whether `stop_in_background` sent the stop."""
        return self._stopping is not None

    def stop_in_background(self) -> None:
        """Send the stop now and wait for the server to go on a thread; `__exit__` joins it. A
        stopped SGLang 0.5.23 server sleeps 5 s before it exits (crash diagnostics: it sees its
        scheduler killed), time the caller can spend on the next server. The thread is not a
        daemon: the session waits for it, so a server that ignores SIGTERM is still killed."""
        if self._stopping is None and self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self._stopping = threading.Thread(target=self._reap, name=f"stop {self.name}")
            self._stopping.start()

    def _terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self._reap()

    def _reap(self) -> None:
        assert self.proc is not None
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


def selected_params(items: list[Any], param: str, fixture: str | None = None,
                    module: Any = None) -> set[Any]:
    """The values of parametrized argument `param` among the collected test `items` (pytest's
    `request.session.items`) that use `fixture` and, if given, live in `module`: the servers
    a selected run needs, so that none is started for a deselected test."""
    return {item.callspec.params.get(param) for item in items
            if hasattr(item, "callspec") and hasattr(item, "fixturenames")
            and (fixture is None or fixture in item.fixturenames)
            and (module is None or item.module is module)}


def one_after_another(servers: list[Server], ahead: int = 1) -> Iterator[Server]:
    """Each server, ready, in order; while the caller uses one, the next `ahead` ones load
    (each stopped in the background when the caller moves past it, all on exit). For servers
    whose answers are compared, not timed: a loading server takes CPU from the one in use.
    A start-up here is CPU-bound (~1.5 of the 2 cores): with one ahead, the next server starts
    when one is taken, so two mostly load side by side and both cores stay busy."""
    lineup = Lineup(ahead)
    with contextlib.ExitStack() as stack:
        stack.callback(lineup.close)
        for i, server in enumerate(servers):
            yield lineup.take(server, servers[i + 1:])
            lineup.done(server)


class Lineup:
    """Servers taken one at a time, each starting the next `ahead` of those still to come, so
    that they load while it answers; a taken server is stopped in the background (`done`), and
    `close` stops every one started."""

    def __init__(self, ahead: int = 1) -> None:
        self.ahead = ahead
        self.started: dict[str, Server] = {}

    def take(self, server: Server, upcoming: list[Server]) -> Server:
        """`server` ready (the one started for its name, if any), with the first `ahead` of
        `upcoming` started."""
        server = self.started.setdefault(server.name, server)
        for later in [server, *upcoming[:self.ahead]]:
            later = self.started.setdefault(later.name, later)
            if later.proc is None:
                later.start()
        return server.wait_ready()

    def take_planned(self, server: Server, plan: list[Server]) -> Server:
        """`take(server, ...)` with the servers after it in `plan` (by name) as upcoming: the
        next one loads while this one answers. A server not in `plan` starts none."""
        names = [s.name for s in plan]
        after = plan[names.index(server.name) + 1:] if server.name in names else []
        return self.take(server, after)

    def done(self, server: Server) -> None:
        self.started[server.name].stop_in_background()

    def close(self) -> None:
        for server in self.started.values():
            server.stop_in_background()
        for server in self.started.values():
            server.__exit__(None, None, None)
