"""benchmarks/serve/bench_many.py: SGLang 0.5.23's own bench_serving parser takes the flags the
serve suite passes, once per concurrency in one process; only the run itself is stood in for
(it needs a server)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks.serve import bench_many

serving = pytest.importorskip("sglang.benchmark.serving")

FLAGS = ["--backend", "sglang", "--host", "127.0.0.1", "--port", "30000", "--model", "m",
         "--tokenizer", "m", "--dataset-name", "random-ids", "--random-input-len", "256",
         "--random-output-len", "64", "--random-range-ratio", "0.5", "--disable-tqdm",
         "--seed", "1"]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []

    def run(args: Any) -> None:
        seen.append(args)
        if args.max_concurrency == 16:
            raise RuntimeError("server gone")
        print(f"ran at {args.max_concurrency}")
        with open(args.output_file, "a") as f:
            f.write(json.dumps({"max_concurrency": args.max_concurrency}) + "\n")

    monkeypatch.setattr(serving, "run_benchmark", run)
    return seen


def test_each_concurrency_runs_in_order_with_its_prompts_and_files(runs: list[Any],
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "bench_x"
    rc = bench_many.main(["--concurrency", "1,64", "--out", str(out), "--", *FLAGS])
    assert rc == 0
    assert [(a.max_concurrency, a.num_prompts) for a in runs] == [(1, 16), (64, 512)]
    assert all(a.port == 30000 and a.dataset_name == "random-ids" and a.random_range_ratio == 0.5
               for a in runs)
    for c in (1, 64):
        assert json.loads(Path(f"{out}_c{c}.jsonl").read_text()) == {"max_concurrency": c}
        assert Path(f"{out}_c{c}.log").read_text() == f"ran at {c}\n"


def test_a_failing_concurrency_is_logged_and_the_rest_still_run(runs: list[Any],
                                                                tmp_path: Path) -> None:
    out = tmp_path / "b"
    assert bench_many.main(["--concurrency", "1,16,64", "--out", str(out), "--", *FLAGS]) == 1
    assert [a.max_concurrency for a in runs] == [1, 16, 64]
    assert "RuntimeError: server gone" in Path(f"{out}_c16.log").read_text()
    assert not Path(f"{out}_c16.jsonl").exists() and Path(f"{out}_c64.jsonl").exists()


@pytest.mark.parametrize(("argv", "needle"), [
    (["--concurrency", "1,x"], "--concurrency '1,x': comma-separated integers"),
    (["--concurrency", "0"], "--concurrency '0': each at least 1"),
    (["--concurrency", "1", "--", "--num-prompts", "3"], "['--num-prompts']: set per concurrency"),
    (["--concurrency", "1", "--", "--output-file=x.jsonl"],
     "['--output-file']: set per concurrency"),
])
def test_bad_arguments_name_the_flag(argv: list[str], needle: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_many.main([*argv[:2], "--out", str(tmp_path / "b"), *argv[2:]])
    assert exc.value.code == 2 and needle in capsys.readouterr().err


def test_prompts_are_four_per_concurrent_request_at_least_eight() -> None:
    assert [bench_many.prompts_for(c) for c in (1, 2, 3, 16)] == [16, 16, 24, 128]


def test_the_serve_suite_reads_each_concurrencys_fresh_record(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """serve_suite.bench runs bench_many.py once with the suite's flags and reads the record of
    this run per concurrency; one left by an earlier call never stands in for a missing one."""
    import subprocess
    import sys

    from benchmarks.serve import serve_suite

    out = tmp_path / "bench_sbo"
    Path(f"{out}_c16.jsonl").write_text(json.dumps({"median_itl_ms": 99.0}) + "\n")  # stale
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> Any:
        calls.append(cmd)
        assert not Path(f"{out}_c16.jsonl").exists()  # removed before the run
        Path(f"{out}_c1.jsonl").write_text(json.dumps({"median_itl_ms": 2.5, "extra": 1}) + "\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(serve_suite.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="concurrency 16 wrote no record"):
        serve_suite.bench(30000, "/m", [1, 16], out)
    (cmd,) = calls
    assert cmd[:2] == [sys.executable, str(Path(serve_suite.__file__).with_name("bench_many.py"))]
    assert cmd[2:7] == ["--concurrency", "1,16", "--out", str(out), "--"]
    args = bench_many_args(cmd[7:])
    assert (args.port, args.model, args.dataset_name) == (30000, "/m", "random-ids")

    def run_all(cmd: list[str], **kwargs: Any) -> Any:
        for c in (1, 16):
            Path(f"{out}_c{c}.jsonl").write_text(json.dumps({"median_itl_ms": float(c)}) + "\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(serve_suite.subprocess, "run", run_all)
    got = serve_suite.bench(30000, "/m", [1, 16], out)
    assert got["1"]["median_itl_ms"] == 1.0 and got["16"]["median_itl_ms"] == 16.0
    assert "extra" not in got["1"] and set(got) == {"1", "16"}


def bench_many_args(flags: list[str]) -> Any:
    """The flags as SGLang 0.5.23's bench_serving parser reads them (its run stood in for)."""
    seen: list[Any] = []
    saved = serving.run_benchmark
    serving.run_benchmark = seen.append
    try:
        import sys
        argv, sys.argv = sys.argv, ["x", *flags, "--max-concurrency", "1", "--num-prompts", "8"]
        try:
            serving.cli_main()
        finally:
            sys.argv = argv
    finally:
        serving.run_benchmark = saved
    return seen[0]


def test_tree_cpu_seconds_agrees_with_psutil_on_a_busy_child() -> None:
    """A child that burns CPU is read under its title with the seconds psutil (an independent
    reader of the same kernel counters) gives, and the parent's own time under `main`."""
    import subprocess
    import sys
    import time

    psutil = pytest.importorskip("psutil")
    burn = ("import time, sys\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
            "sys.stdout.write('done\\n'); sys.stdout.flush(); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        time.sleep(0.05)
        got = bench_many.tree_cpu_seconds(os.getpid())
        times = psutil.Process(child.pid).cpu_times()
        mine = psutil.Process().cpu_times()
    finally:
        child.kill()
        child.wait()
    assert got[sys.executable] == pytest.approx(times.user + times.system, abs=0.02)
    assert got[sys.executable] >= 0.39
    assert got["main"] == pytest.approx(mine.user + mine.system, abs=0.05)
    assert bench_many.tree_cpu_seconds(child.pid) == {}  # gone


def fake_proc(root: Path, pid: int, ppid: int, comm: str, ticks: tuple[int, int],
              cmdline: bytes | None) -> None:
    d = root / str(pid)
    d.mkdir()
    rest = ["S", str(ppid)] + ["0"] * 9 + [str(ticks[0]), str(ticks[1])] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")
    if cmdline is not None:
        (d / "cmdline").write_bytes(cmdline)


def test_tree_cpu_seconds_sums_the_tree_by_title(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    fake_proc(tmp_path, 10, 1, "python3", (3 * tick, tick), b"python3\0-c\0x\0")
    fake_proc(tmp_path, 11, 10, "sglang::sched) x", (tick, 0), b"sglang::scheduler_TP0" + b" " * 8)
    fake_proc(tmp_path, 12, 10, "sglang::detoken", (0, tick // 2), b"sglang::detokenizer\0")
    fake_proc(tmp_path, 13, 11, "python3", (tick, tick), b"/usr/bin/python3\0-c\0")
    fake_proc(tmp_path, 14, 11, "python3", (tick, 0), b"/usr/bin/python3\0")
    fake_proc(tmp_path, 15, 13, "gone", (tick, 0), None)  # ended between the two reads
    fake_proc(tmp_path, 20, 1, "other", (9 * tick, 0), b"other\0")  # not below the root
    (tmp_path / "self").mkdir()
    got = bench_many.tree_cpu_seconds(10, tmp_path)
    assert got == {"main": 4.0, "sglang::scheduler_TP0": 1.0, "sglang::detokenizer": 0.5,
                   "/usr/bin/python3": 3.0}
    assert bench_many.tree_cpu_seconds(99, tmp_path) == {}


def test_cpu_delta_counts_new_titles_from_zero() -> None:
    assert bench_many.cpu_delta({"a": 1.0, "gone": 5.0}, {"a": 1.25, "new": 0.5}) == {
        "a": 0.25, "new": 0.5}


def test_watch_pid_writes_each_runs_cpu_seconds(runs: list[Any], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([{"main": 1.0}, {"main": 1.5, "sglang::scheduler_TP0": 2.0},
                     {"main": 2.0}, {"main": 4.0}])
    seen: list[int] = []

    def read(pid: int) -> dict[str, float]:
        seen.append(pid)
        return next(readings)

    monkeypatch.setattr(bench_many, "tree_cpu_seconds", read)
    out = tmp_path / "b"
    assert bench_many.main(["--concurrency", "1,64", "--out", str(out), "--watch-pid", "4242",
                            "--", *FLAGS]) == 0
    assert seen == [4242] * 4
    assert json.loads(Path(f"{out}_c1.cpu.json").read_text()) == {
        "main": 0.5, "sglang::scheduler_TP0": 2.0}
    assert json.loads(Path(f"{out}_c64.cpu.json").read_text()) == {"main": 2.0}
    other = tmp_path / "n"
    assert bench_many.main(["--concurrency", "1", "--out", str(other), "--", *FLAGS]) == 0
    assert not Path(f"{other}_c1.cpu.json").exists() and len(seen) == 4


def test_the_serve_suite_watches_the_server_and_keeps_its_cpu(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    import subprocess

    from benchmarks.serve import serve_suite

    out = tmp_path / "bench_base"
    Path(f"{out}_c16.cpu.json").write_text(json.dumps({"main": 9.0}))  # an earlier call's
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> Any:
        calls.append(cmd)
        for c in (1, 16):
            Path(f"{out}_c{c}.jsonl").write_text(json.dumps(
                {"median_itl_ms": 2.0, "total_output_tokens": 100 * c}) + "\n")
        Path(f"{out}_c1.cpu.json").write_text(json.dumps({"main": 0.25}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(serve_suite.subprocess, "run", run)
    got = serve_suite.bench(30000, "/m", [1, 16], out, pid=777)
    assert calls[0][2:9] == ["--concurrency", "1,16", "--out", str(out), "--watch-pid", "777",
                             "--"]
    assert got["1"] == {**dict.fromkeys(got["1"]), "median_itl_ms": 2.0,
                        "total_output_tokens": 100, "cpu_s": {"main": 0.25}}
    assert "cpu_s" not in got["16"] and got["16"]["total_output_tokens"] == 1600
