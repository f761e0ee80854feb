"""benchmarks/serve/bench_many.py: SGLang 0.5.23's own bench_serving parser takes the flags the
serve suite passes, once per concurrency in one process; only the run itself is stood in for
(it needs a server)."""

from __future__ import annotations

import json
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
