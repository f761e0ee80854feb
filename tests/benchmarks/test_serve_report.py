"""benchmarks/serve/report.py on hand-made records: the token criterion, decisions against
replays (and the planted-bug server, which passes only when that check fails), /metrics parsing."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.serve import report


def rec(name: str, *, ids: list[int], top2: list[list[list[float]]] | None = None,
        modes: tuple[str, ...] = (), decisions: dict[str, int] | None = None,
        replays: dict[str, int] | None = None, planted: bool = False,
        metrics: list[str] | None = None) -> dict[str, Any]:
    top2 = top2 or [[[-0.1, i], [-3.0, i + 1]] for i in ids]
    row = {"ids": ids, "top2": top2}
    return {"name": name, "flags": [], "tree": "sgl-deep-ep", "modes": list(modes),
            "planted": planted, "tokens_batch": [row], "tokens_single": [row],
            "bench": {"1": {"median_itl_ms": 2.0, "output_throughput": 100.0}},
            "capture": [{"time_s": 3.0, "mem_gb": 0.5, "avail_gb": 10.0}],
            "gate": {"counters": {"decisions": [["decode", m, n]
                                                for m, n in (decisions or {}).items()]}},
            "graphs": {"replays": {f"overlap:{m}": n for m, n in (replays or {}).items()}},
            "metrics": metrics or [], "plugin_log": []}


def test_tokens_equal_near_tie_and_different() -> None:
    base = [{"ids": [1, 2, 3], "top2": [[[-0.1, 1], [-2, 9]], [[-0.50, 2], [-0.52, 7]],
                                         [[-0.1, 3], [-2, 8]]]}]
    assert report.token_verdict([{"ids": [1, 2, 3]}], base) == (True, "1/1 equal")
    ok, text = report.token_verdict([{"ids": [1, 7, 5]}], base)  # the runner-up of a near tie
    assert ok and "near-tie p0@1" in text
    ok, text = report.token_verdict([{"ids": [1, 2, 8]}], base)  # a 1.9-nat gap: a real change
    assert not ok and "DIFFERENT p0@2" in text


def test_decisions_against_replays() -> None:
    good = rec("auto", ids=[1], modes=("tbo", "none"), decisions={"tbo": 2, "none": 5},
               replays={"tbo": 2, "none": 5})
    assert report.decisions_vs_replays(good) == (True, "tbo 2/2 none 5/5")
    bad = rec("auto", ids=[1], modes=("sbo", "none"), decisions={"sbo": 1, "none": 5},
              replays={"sbo": 3, "none": 3})
    assert report.decisions_vs_replays(bad)[0] is False
    nothing = rec("auto", ids=[1], modes=("sbo",), decisions={}, replays={})
    assert report.decisions_vs_replays(nothing)[0] is False  # no replay at all proves nothing


def test_planted_server_passes_only_when_caught() -> None:
    base = rec("base", ids=[1, 2])
    caught = rec("auto_planted", ids=[1, 2], modes=("sbo", "none"), planted=True,
                 decisions={"sbo": 1, "none": 5}, replays={"sbo": 4, "none": 2})
    text, ok = report.table({"base": base, "auto_planted": caught}, [])
    assert ok and "caught: sbo 1/4 none 5/2" in text
    missed = rec("auto_planted", ids=[1, 2], modes=("sbo", "none"), planted=True,
                 decisions={"sbo": 1, "none": 5}, replays={"sbo": 1, "none": 5})
    text, ok = report.table({"base": base, "auto_planted": missed}, [])
    assert not ok and "NOT CAUGHT" in text


def test_gpu_memory_left_by_an_earlier_server_is_named() -> None:
    base = rec("base", ids=[1, 2]) | {"gpu_used_mib_before": 0}
    plugin = rec("plugin", ids=[1, 2]) | {"gpu_used_mib_before": report.HELD_MIB}
    text, _ = report.table({"base": base, "plugin": plugin}, [])
    assert "already in use" not in text  # at the threshold: not named
    plugin["gpu_used_mib_before"] = report.HELD_MIB + 1
    text, ok = report.table({"base": base, "plugin": plugin}, [])
    assert ok and text.endswith(f"GPU memory already in use when a server started: plugin "
                                f"({report.HELD_MIB + 1} MiB)")


def test_metrics_by_label() -> None:
    lines = ['sglang_overlap_steps_total{model_name="/m",phase="decode",mode="sbo",'
             'runner="graph"} 12.0',
             'sglang_overlap_steps_total{model_name="/m",phase="prefill",mode="sbo",'
             'runner="eager"} 3.0',
             'sglang_overlap_steps_total{model_name="/m",phase="decode",mode="none",'
             'runner="graph"} 4.0',
             'sglang_overlap_sbo_producer_launches_total{model_name="/m",producer="deepgemm"} 7.0',
             'sglang_overlap_steps_created{model_name="/m",phase="decode",mode="sbo"} 1.7e9']
    r = rec("sbo", ids=[1], metrics=lines)
    assert report.metric_counts(r, "steps", "mode") == {"sbo": 15.0, "none": 4.0}
    assert report.metric_counts(r, "sbo_producer_launches", "producer") == {"deepgemm": 7.0}
    text, ok = report.table({"base": rec("base", ids=[1]), "sbo": r}, [])
    assert ok and "| none 4 sbo 15 |" in text and "| deepgemm 7 |" in text


def test_capture_line_of_the_supported_sglang() -> None:
    """The regex against the line SGLang 0.5.23 logs (cuda_graph_setup.py's f-strings)."""
    from benchmarks.serve.serve_suite import CAPTURE_END

    decode = ("[2026-12-06 21:00:01] Capture decode cuda graph end. bs=[1, 2, 4, 8], "
              "elapsed=12.34 s, mem usage=1.25 GB, avail mem=9.87 GB.")
    prefill = "Capture prefill CUDA graph end. elapsed=0.50 s, mem usage=0.10 GB, avail mem=9.7 GB."
    assert CAPTURE_END.findall(decode) == [("decode cuda graph", "12.34", "1.25", "9.87")]
    assert CAPTURE_END.findall(prefill) == [("prefill CUDA graph", "0.50", "0.10", "9.7")]
    assert not CAPTURE_END.findall("Capture cuda graph end. Time elapsed: 1.0 s. mem usage=1 GB")


def test_a_server_that_must_be_refused() -> None:
    base = rec("base", ids=[1])
    refused = {"name": "tbo_one_rank", "flags": ["--enable-two-batch-overlap"],
               "tree": "sgl-deep-ep", "refused_needle": "needs the experts on 2 or more ranks",
               "refused": True, "capture": [], "plugin_log": []}
    text, ok = report.table({"base": base, "tbo_one_rank": refused}, [])
    assert ok and "refused at start, as it must be" in text
    started = {**refused, "refused": False,
               "error": "started, but the plugin should have refused these flags"}
    text, ok = report.table({"base": base, "tbo_one_rank": started}, [])
    assert not ok and "FAILED: started" in text


def test_expect_refusal_reads_the_log(tmp_path) -> None:
    import subprocess
    import sys

    from benchmarks.serve.serve_suite import expect_refusal

    log = tmp_path / "server.log"
    for said, want in (("sglang-overlap: TBO needs the experts on 2 or more ranks", True),
                       ("Traceback: KeyError 'dispatch_output'", False)):
        log.write_text(said)
        proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
        proc.wait()
        r: dict = {}
        expect_refusal(r, "needs the experts on 2 or more ranks", "http://127.0.0.1:9", proc,
                       log, timeout=5)
        assert r["refused"] is want and ("error" in r) is (not want)


def test_the_suites_flags_parse_as_sglang_reads_them() -> None:
    """Every server's command line, read by SGLang 0.5.23's own parser: decode graphs up to
    bs 64 (7 sizes), one rank, deepep low latency, 256-token prefill chunks."""
    import argparse

    pytest.importorskip("sglang.srt.server_args")
    from sglang.srt.server_args import ServerArgs

    from benchmarks.serve.serve_suite import SERVERS, common_flags, graph_sizes

    assert graph_sizes(64) == ["1", "2", "4", "8", "16", "32", "64"]
    assert graph_sizes(48) == ["1", "2", "4", "8", "16", "32", "48"]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for name, spec in SERVERS.items():
        if spec.site:  # the plugin's flags are registered by the plugin, not SGLang
            continue
        args = parser.parse_args([*common_flags("/m", 31000, 64), *spec.flags])
        assert args.cuda_graph_bs_decode == [1, 2, 4, 8, 16, 32, 64], name
        assert (args.cuda_graph_max_bs_decode, args.tp_size, args.moe_a2a_backend,
                args.deepep_mode, args.chunked_prefill_size, args.max_prefill_tokens) == (
            64, 1, "deepep", "low_latency", 256, 256), name
        assert args.disable_prefill_cuda_graph and args.enable_metrics, name


def test_stop_leaves_no_child_of_the_server_behind(tmp_path) -> None:
    """The server exits on SIGTERM, a child that ignores it (as a busy scheduler may) must not
    outlive it into the next server's measurements."""
    import os
    import subprocess
    import sys
    import time

    from benchmarks.serve import serve_suite

    pid_file = tmp_path / "child.pid"
    child = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)")
    leader = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}, "
              f"{str(pid_file)!r}]); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", leader], start_new_session=True)
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    t0 = time.time()
    serve_suite.stop(proc)
    assert time.time() - t0 < 20 and proc.returncode is not None
    for _ in range(100):  # reparented and reaped once killed
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"child {pid} outlived its server")


def test_gpu_state_reads_each_field_and_keeps_those_the_driver_knows(tmp_path, monkeypatch) -> None:
    """nvidia-smi answers per field; a field it refuses (an older driver) or answers with nothing
    is left out, the rest kept; no nvidia-smi at all gives None."""
    from benchmarks.serve import serve_suite

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n"
                    "  --query-gpu=clocks.sm) echo '1980 '; echo '1755' ;;\n"
                    "  --query-gpu=temperature.gpu) echo ' 61 ' ;;\n"
                    "  --query-gpu=clocks.mem) ;;\n"
                    "  *) echo 'Field is not a valid field to query.' >&2; exit 2 ;;\nesac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert serve_suite.gpu_state() == {"clocks.sm": "1980", "temperature.gpu": "61"}
    assert serve_suite.gpu_used_mib() is None, "memory.used refused"
    fake.unlink()
    assert serve_suite.gpu_state() is None and serve_suite.gpu_used_mib() is None


@pytest.mark.parametrize(("answer", "want"), [("echo ' 100'; echo '250 '", 350),
                                              ("echo 'N/A'", None), (":", 0)])
def test_gpu_used_mib_sums_every_gpu(tmp_path, monkeypatch, answer: str, want: int | None) -> None:
    from benchmarks.serve import serve_suite

    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --query-gpu=memory.used ] || exit 2\n{answer}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert serve_suite.gpu_used_mib() == want


def test_cpu_per_output_token_by_process_group() -> None:
    b = {"total_output_tokens": 500, "cpu_s": {"sglang::scheduler_TP0": 1.0, "main": 0.25,
                                                 "sglang::detokenizer": 0.05, "python3": 0.1,
                                                 "sglang::scheduler_TP1": 0.5}}
    assert report.cpu_per_token(b) == pytest.approx(
        {"scheduler": 3.0, "main": 0.5, "detokenizer": 0.1, "other": 0.2})
    assert report.cpu_per_token({"total_output_tokens": 500}) is None
    assert report.cpu_per_token({"cpu_s": {"main": 1.0}, "total_output_tokens": 0}) is None
    base = rec("base", ids=[1, 2])
    plugin = rec("plugin", ids=[1, 2])
    base["bench"] = {"1": {"median_itl_ms": 2.0, "output_throughput": 100.0, **b},
                     "64": {"median_itl_ms": 9.0, "output_throughput": 900.0}}
    text, ok = report.table({"base": base, "plugin": plugin}, [])
    assert ok
    lines = text.splitlines()
    assert lines[-3:] == ["| server | c=1 |", "|---|---|", "| base | 3.00 / 0.50 / 0.10 / 0.20 |"]
    assert lines[-5].endswith("scheduler / main / detokenizer / other")
    assert "CPU ms" not in report.table({"plugin": plugin}, [])[0]


def test_kernel_checks_skipped_at_staging_are_said_not_crashed_on(tmp_path) -> None:
    """stage.sh under STAGE_CHECKS=0 writes {"skipped": ...} for the kernels (the H100 run of
    2026-12-08 crashed the report on it)."""
    import json

    base = rec("base", ids=[1, 2])
    (tmp_path / "serve_base.json").write_text(json.dumps(base))
    (tmp_path / "stack.json").write_text(json.dumps({"kernels": {"skipped": "STAGE_CHECKS=0"}}))
    assert report.main([str(tmp_path), "--json", str(tmp_path / "all.json")]) == 0
    text, ok = report.table({"base": base}, {"skipped": "STAGE_CHECKS=0"})
    assert ok and text.startswith("Kernels on the staged stack: not checked (STAGE_CHECKS=0)")
    text, ok = report.table({"base": base}, [{"check": "rmsnorm", "ok": False, "bound": 1}])
    assert not ok and text.startswith("Kernels on the staged stack: rmsnorm FAIL")
