"""`sglang-overlap launch` with real servers: the tiny PD config (prefill with TBO + two-chunk,
decode with SBO, each --tp 2 over the plugin's torch_a2a; smg router; Mooncake over TCP) serves
the same greedy tokens as one plain single-rank server without overlap, Ctrl-C stops
everything, and killing one child brings the whole launch down with a clear message and no
strays."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_helpers import CONFIGS, LaunchRun, generate

pytestmark = pytest.mark.e2e

ROUTER = "http://127.0.0.1:31080"
SINGLE = "http://127.0.0.1:31010"
LONG = " ".join(f"The quick brown fox {i} jumps over the lazy dog {i * 7 % 10}." for i in range(40))
PROMPTS = [
    LONG,  # one long request alone: prefill cuts it in two chunks
    "The capital of France is",
    "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
]


@pytest.fixture(scope="module")
def launches(sglang_pd_env: dict[str, str], tiny_dsv3: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LaunchRun, LaunchRun]]:
    work = tmp_path_factory.mktemp("launch-pd")
    pd = LaunchRun("pd", CONFIGS / "tiny-cpu-pd.toml", tiny_dsv3, sglang_pd_env, work)
    single = LaunchRun("single", CONFIGS / "tiny-cpu-single.toml", tiny_dsv3, sglang_pd_env,
                       work, extra=("--no-validate",))
    try:
        pd.start()
        single.start()
        pd.wait_ready()
        single.wait_ready()
        yield pd, single
    finally:
        pd.close()
        single.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_pd_launch_serves_single_server_tokens(launches: tuple[LaunchRun, LaunchRun]) -> None:
    pd, _ = launches
    out = pd.output()
    assert "checking server flags with SGLang's parser" in out
    for role in ("prefill", "decode", "router"):
        log = pd.workdir / "pd-logs" / f"{role}.log"
        assert f"{role}: started pid" in out and f"log {log}" in out, out
        assert log.is_file() and log.stat().st_size > 0
    # Each server's own log shows the plugin's overlap path ran (at warmup at the latest).
    logs = {r: (pd.workdir / "pd-logs" / f"{r}.log").read_text(errors="replace")
            for r in ("prefill", "decode")}
    assert "(first tbo" in logs["prefill"] and "two_chunk=" in logs["prefill"], logs["prefill"]
    assert "(first sbo" in logs["decode"] and "(first tbo" not in logs["decode"], logs["decode"]
    for prompt in PROMPTS:
        via_router = generate(ROUTER, prompt, 16)
        single = generate(SINGLE, prompt, 16)
        assert via_router["output_ids"] == single["output_ids"], f"{prompt=}"
        assert len(single["output_ids"]) == 16


def test_sigint_stops_every_process(launches: tuple[LaunchRun, LaunchRun]) -> None:
    _, single = launches
    server = single.pid_of("server")
    assert single.proc is not None and single.strays()
    single.proc.send_signal(signal.SIGINT)
    assert single.wait_exit(120) == 130
    assert "received SIGINT: stopping everything" in single.output()
    assert single.strays() == [] and not _alive(server)


def test_killing_one_child_stops_the_launch(launches: tuple[LaunchRun, LaunchRun]) -> None:
    pd, _ = launches
    pids = {role: pd.pid_of(role) for role in ("prefill", "decode", "router")}
    os.kill(pids["decode"], signal.SIGKILL)
    assert pd.wait_exit(150) == 1
    out = pd.output()
    assert f"error: decode (pid {pids['decode']}) killed by SIGKILL; last lines of " in out, out
    assert "stopped every process of this launch" in out
    assert "Traceback" not in out.split("killed by SIGKILL")[0]
    assert pd.strays() == [], out
    assert not any(_alive(p) for p in pids.values()), pids
