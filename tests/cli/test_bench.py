"""Tests for `sglang-overlap bench` (cli/bench.py): arguments, the bench_serving command it runs,
reading its result file, the table. Runs against real servers are in tests/e2e/test_gating.py."""

from __future__ import annotations

import argparse
import json
import re
import socket
from pathlib import Path

import pytest

from sglang_overlap.cli import bench
from sglang_overlap.cli.main import build_parser, main

# One line of bench_serving's --output-file (sglang 0.5.23, tiny model on CPU), keys trimmed.
RESULT = {"backend": "sglang", "dataset_name": "random-ids", "duration": 8.59, "completed": 64,
          "request_throughput": 7.45, "input_throughput": 1907.2, "output_throughput": 125.33,
          "total_throughput": 2032.5, "mean_ttft_ms": 426.23, "median_ttft_ms": 400.0,
          "p99_ttft_ms": 900.0, "mean_itl_ms": 103.22, "median_itl_ms": 100.0,
          "p99_itl_ms": 300.0, "mean_tpot_ms": 101.0, "mean_e2e_latency_ms": 3600.0}


def _args(*argv: str) -> argparse.Namespace:
    return build_parser(["bench"]).parse_args(["bench", *argv])


def test_defaults_and_argv() -> None:
    args = _args("--url", "http://h:1/", "--compare-url", "http://h:2", "--tokenizer", "/tok",
                 "--extra", "--warmup-requests 2")
    targets = bench.targets_of(args)
    assert [(t.label, t.url) for t in targets] == [("base", "http://h:1"), ("B", "http://h:2")]
    argv = bench.bench_argv(args, targets[0].url, 7, Path("/tmp/o.jsonl"))
    joined = " ".join(argv)
    for part in ("-m sglang.benchmark.serving --backend sglang --base-url http://h:1",
                 "--dataset-name random-ids", "--num-prompts 64", "--random-input-len 256",
                 "--random-output-len 32", "--max-concurrency 16", "--seed 7",
                 "--output-file /tmp/o.jsonl", "--tokenizer /tok", "--warmup-requests 2"):
        assert part in joined, f"{part=} {joined=}"
    labelled = bench.targets_of(_args("--url", "u1", "--compare-url", "u2", "--label", "none",
                                      "--label", "auto"))
    assert [t.label for t in labelled] == ["none", "auto"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--rounds", "0"], "--rounds must be >= 1 (got 0)"),
    (["--num-prompts", "0"], "--num-prompts must be >= 1"),
    (["--range-ratio", "2"], "--range-ratio must be in [0, 1]"),
    (["--label", "a", "--label", "b"], "--label given 2 times for 1 servers"),
    (["--dataset", "random", "--dataset-path", "/nonexistent.json"],
     "--dataset-path /nonexistent.json does not exist"),
])
def test_bad_arguments_name_the_flag(argv: list[str], needle: str) -> None:
    with pytest.raises(bench.BenchError, match=re.escape(needle)):
        bench.check_args(_args("--url", "http://h:1", *argv))


def test_unreachable_server_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["bench", "--url", f"http://127.0.0.1:{port}", "--no-progress"]) == 2
    assert f"server base at http://127.0.0.1:{port} is not reachable" in capsys.readouterr().err


def test_read_result(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({**RESULT, "output_throughput": 1.0}) + "\n" + json.dumps(RESULT))
    got = bench.read_result(path)
    assert got["output_throughput"] == 125.33 and got["mean_itl_ms"] == 103.22
    with pytest.raises(bench.BenchError, match="wrote no result"):
        bench.read_result(tmp_path / "missing.jsonl")
    path.write_text(json.dumps({"duration": 1.0}))
    with pytest.raises(bench.BenchError, match="lacks \\['output_throughput'"):
        bench.read_result(path)


def test_summary_and_table() -> None:
    args = _args("--url", "http://a", "--compare-url", "http://b", "--rounds", "2")
    a, b = bench.targets_of(args)
    a.rounds = [dict(RESULT), {**RESULT, "output_throughput": 100.0}]
    b.rounds = [{**RESULT, "output_throughput": 62.665}, {**RESULT, "output_throughput": 50.0}]
    s = bench.summary([a, b])
    ratio = s["servers"][1]["output_throughput_ratio"]
    assert ratio["ratio"] == pytest.approx(0.5) and ratio["ci95"][0] == pytest.approx(0.5)
    assert s["servers"][0]["output_throughput"] == pytest.approx((125.33 + 100) / 2)
    text = bench.format_table([a, b], args)
    row = next(line for line in text.splitlines() if line.startswith("B "))
    assert "56.33" in row and "0.500x [0.500, 0.500]" in row, text
    assert "ratios vs base with 95% CI" in text
