"""`sglang-overlap gsm8k` and sglang_overlap/evals/gsm8k.py: prompts, parsing, statistics, CLI.

Hand-worked cases plus a brute-force reference for the paired interval. The CLI tests that need a
server use a small stdlib HTTP server that records what it is sent and answers from the data's
reference solutions: it shows the exact requests (prompt, stops, temperature), which a real
server cannot; tests/e2e/test_gsm8k_e2e.py runs the same commands against real SGLang servers.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_overlap.cli.main import main
from sglang_overlap.evals import gsm8k as ev

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 18", 18),
        ("She makes 9 * 2 = $18 every day.\n#### 18", 18),
        ("The answer is 1,234.", 1234),
        ("It costs $3.50", 50),  # upstream's convention: last run of digits
        ("-7 degrees", 7),
        ("no number here", None),
        ("", None),
        ("12 apples and 5 pears\n\nQuestion", 5),
    ],
)
def test_extract_answer(text: str, expected: int | None) -> None:
    assert ev.extract_answer(text) == expected, f"{text=}"


def _examples(n: int) -> list[ev.Example]:
    return [ev.Example(f"q{i}?", f"work {i}\n#### {i}", i) for i in range(n)]


def test_prompts_are_sglang_few_shot_format() -> None:
    prompts = ev.build_prompts(_examples(4), num_questions=2, num_shots=2)
    shots = "Question: q0?\nAnswer: work 0\n#### 0\n\nQuestion: q1?\nAnswer: work 1\n#### 1\n\n"
    assert prompts == [shots + "Question: q0?\nAnswer:", shots + "Question: q1?\nAnswer:"]
    assert ev.build_prompts(_examples(3), 1, 0) == ["Question: q0?\nAnswer:"]


def test_bad_counts_name_the_flag() -> None:
    with pytest.raises(ev.EvalError, match="--num-shots"):
        ev.build_prompts(_examples(3), 1, 4)
    with pytest.raises(ev.EvalError, match="--num-questions"):
        ev.build_prompts(_examples(3), 0, 1)


def test_load_examples_errors(tmp_path: Path) -> None:
    with pytest.raises(ev.EvalError, match="not found"):
        ev.load_examples(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "#### 1"}\n{"question": "b"}\n')
    with pytest.raises(ev.EvalError, match=r"bad.jsonl:2:"):
        ev.load_examples(bad)
    nolabel = tmp_path / "nolabel.jsonl"
    nolabel.write_text('{"question": "a", "answer": "none"}\n')
    with pytest.raises(ev.EvalError, match=r"nolabel.jsonl:1: .* no integer"):
        ev.load_examples(nolabel)


def test_shipped_sample_parses(gsm8k_sample: Path) -> None:
    examples = ev.load_examples(gsm8k_sample)
    assert len(examples) == 50
    assert examples[0].label == 18 and examples[0].question.startswith("Janet")
    assert examples[49].label == 30  # the 50th problem of the public test set
    assert "MIT License" in (gsm8k_sample.parent / "LICENSE").read_text()


def test_paired_difference_hand_worked() -> None:
    a = [True, True, False, False, True]
    b = [True, False, False, True, False]
    # n10 = 2 (questions 1, 4), n01 = 1 (question 3): d = 1/5; var = (3/5 - 1/25)/5 = 0.112
    d, lo, hi = ev.paired_difference(a, b)
    half = 1.96 * math.sqrt(0.112)
    assert d == pytest.approx(0.2)
    assert (lo, hi) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    assert ev.paired_difference([True, False], [True, False]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equal"):
        ev.paired_difference([True], [True, False])


def _reference_interval(a: list[bool], b: list[bool]) -> tuple[float, float, float]:
    """Mean and normal interval of the per-question differences (population variance)."""
    diffs = [int(x) - int(y) for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((x - mean) ** 2 for x in diffs) / n
    half = 1.96 * math.sqrt(var / n)
    return mean, mean - half, mean + half


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_paired_difference_matches_reference(pairs: list[tuple[bool, bool]]) -> None:
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    got, want = ev.paired_difference(a, b), _reference_interval(a, b)
    assert got == pytest.approx(want, abs=1e-12), f"{a=} {b=} {got=} {want=}"


def _result(preds: list[int | None], labels: list[int], outputs: list[str]) -> ev.EvalResult:
    return ev.EvalResult("u", tuple(labels), tuple(preds), tuple(outputs), 10, 2.0, ())


def test_result_and_comparison_stats() -> None:
    a = _result([1, None, 3, 4], [1, 2, 3, 5], ["1", "x", "3", "4"])
    b = _result([1, None, 9, 5], [1, 2, 3, 5], ["1", "x", "9", "5!"])
    assert (a.accuracy, a.invalid_rate, a.output_throughput) == (0.5, 0.25, 5.0)
    c = ev.Comparison(a, b)
    assert c.answer_agreement == 0.5  # questions 0 and 1 (both invalid counts as agreeing)
    assert c.text_agreement == 0.5
    assert c.disagreements() == [2, 3]
    d, lo, hi = c.difference  # n10 = 1 (q2), n01 = 1 (q3)
    assert d == 0.0 and lo == pytest.approx(-1.96 * math.sqrt(0.5 / 4))
    report = c.to_dict()
    assert report["disagreeing_questions"] == [2, 3] and report["a"]["accuracy"] == 0.5


def test_score_counts_failed_requests_as_invalid() -> None:
    comps = [ev.Completion("#### 0", 3, 0.1), ev.Completion("", 0, 0.1, "HTTP 500: boom")]
    r = ev.score("u", _examples(2), comps, wall_s=1.0)
    assert r.preds == (0, None) and r.errors == ("question 1: HTTP 500: boom",)
    assert (r.accuracy, r.invalid_rate, r.output_tokens) == (0.5, 0.5, 3)


# --- the command, against a recording HTTP server -------------------------------------------


class _Oracle(BaseHTTPRequestHandler):
    """Answers each GSM8K prompt with the reference solution (+ `shift` on the number)."""

    answers: dict[str, str] = {}
    seen: list[dict[str, Any]] = []
    shift = 0

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        question = body["text"].rsplit("Question: ", 1)[1].removesuffix("\nAnswer:")
        label = ev.extract_answer(self.answers[question]) or 0
        text = f" so the answer is {label + self.shift}."
        self._send(200, {"text": text, "meta_info": {"completion_tokens": 7}})


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "test.jsonl"
    rows = [{"question": f"How many {i}?", "answer": f"It is {i}*2.\n#### {2 * i}"}
            for i in range(1, 9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _serve(shift: int, answers: dict[str, str]) -> tuple[ThreadingHTTPServer, str]:
    handler = type("Oracle", (_Oracle,), {"answers": answers, "seen": [], "shift": shift})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def oracles(data_file: Path) -> Iterator[tuple[str, str, type]]:
    answers = {e.question: e.answer for e in ev.load_examples(data_file)}
    right, right_url = _serve(0, answers)
    wrong, wrong_url = _serve(1, answers)
    yield right_url, wrong_url, right.RequestHandlerClass
    right.shutdown()
    wrong.shutdown()


def test_cli_single_server_json(oracles: tuple[str, str, type], data_file: Path,
                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, _, handler = oracles
    dump = tmp_path / "dump.jsonl"
    rc = main(["gsm8k", "--url", url, "--data-path", str(data_file), "--num-questions", "6",
               "--num-shots", "2", "--max-new-tokens", "33", "--parallel", "3", "--json",
               "--dump", str(dump)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    records = [json.loads(line) for line in dump.read_text().splitlines()]
    assert [(r["question"], r["label"], r["pred"], r["correct"]) for r in records] == [
        (i, 2 * (i + 1), 2 * (i + 1), True) for i in range(6)]
    assert records[0]["output"] == " so the answer is 2."
    assert out["num_questions"] == 6 and out["accuracy"] == 1.0 and out["invalid"] == 0.0
    assert out["output_tokens"] == 42 and out["errors"] == []
    seen = handler.seen  # type: ignore[attr-defined]
    assert len(seen) == 6
    assert {s["sampling_params"]["max_new_tokens"] for s in seen} == {33}
    assert all(s["sampling_params"]["temperature"] == 0 for s in seen)
    assert seen[0]["sampling_params"]["stop"] == ["Question", "Assistant:", "<|separator|>"]
    assert all(s["text"].startswith("Question: How many 1?\nAnswer: It is 1*2.\n#### 2\n\n"
                                    "Question: How many 2?") for s in seen)


def test_cli_compare_reports_difference_and_agreement(
    oracles: tuple[str, str, type], data_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    right, wrong, _ = oracles
    rc = main(["gsm8k", "--url", wrong, "--compare-url", right, "--data-path", str(data_file),
               "--num-questions", "8", "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "Accuracy difference (url - compare-url): -1.000  95% CI [-1.000, -1.000]" in text
    assert "Answer agreement: 0.000" in text
    rc = main(["gsm8k", "--url", right, "--compare-url", right, "--data-path", str(data_file),
               "--num-questions", "8", "--no-progress", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["answer_agreement"] == 1.0 and report["ci95"] == [0.0, 0.0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--url", "http://127.0.0.1:{port}"], "cannot reach server at http://127.0.0.1:{port}"),
        (["--num-questions", "99"], "--num-questions 99 exceeds the 8 questions"),
        (["--parallel", "0"], "--parallel must be >= 1"),
    ],
)
def test_cli_errors_are_one_line(extra: list[str], message: str, data_file: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    port = _closed_port()
    argv = ["gsm8k", "--data-path", str(data_file), "--num-questions", "2"]
    argv += [e.format(port=port) for e in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sglang-overlap gsm8k: error: ") and "\n" not in err, err
    assert message.format(port=port) in err


def test_cli_missing_data_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gsm8k", "--data-path", str(tmp_path / "nope.jsonl")]) == 2
    assert "GSM8K data file not found" in capsys.readouterr().err


# --- the public test set: downloaded once, refused when not GSM8K, one line when offline ------


class _Files(BaseHTTPRequestHandler):
    routes: dict[str, bytes] = {}
    hits: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = self.routes.get(self.path)
        self.send_response(404 if body is None else 200)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")


@pytest.fixture
def files(gsm8k_sample: Path) -> Iterator[tuple[str, type]]:
    routes = {"/test.jsonl": gsm8k_sample.read_bytes(),
              "/portal": b"<html><body>Sign in to continue</body></html>\n"}
    handler = type("Files", (_Files,), {"routes": routes, "hits": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()


def test_fetch_downloads_once_then_reads_the_cache(files: tuple[str, type], tmp_path: Path,
                                                   gsm8k_sample: Path) -> None:
    url, handler = files
    path = ev.fetch_canonical(tmp_path, url + "/test.jsonl")
    assert path == tmp_path / "gsm8k" / "test.jsonl"
    assert path.read_bytes() == gsm8k_sample.read_bytes()
    assert ev.fetch_canonical(tmp_path, url + "/test.jsonl") == path
    assert handler.hits == ["/test.jsonl"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("route", "message"), [("/portal", r"/portal is not GSM8K \("),
                                                 ("/missing", r"/missing \(HTTP 404\)")])
def test_fetch_refuses_and_caches_nothing(files: tuple[str, type], tmp_path: Path, route: str,
                                          message: str) -> None:
    url, _ = files
    with pytest.raises(ev.EvalError, match=message) as info:
        ev.fetch_canonical(tmp_path, url + route)
    assert str(info.value).endswith("pass a local test.jsonl with --data-path"), info.value
    assert "\n" not in str(info.value)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_cli_without_data_path_fetches_the_public_set_or_says_offline(
    tmp_path: Path, gsm8k_sample: Path
) -> None:
    """The real public address. Offline (this project's machines and CI), the command ends with one
    line naming the address and --data-path; online, it caches the whole test set."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_overlap", "gsm8k", "--url",
         f"http://127.0.0.1:{_closed_port()}", "--num-questions", "2", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    notice, error = proc.stderr.strip().splitlines()
    cache = tmp_path / "sglang-overlap" / "gsm8k"
    assert notice == f"downloading the GSM8K test set from {ev.CANONICAL_URL} into {cache}"
    if error.startswith("sglang-overlap gsm8k: error: cannot download GSM8K"):  # offline
        assert error.startswith(f"sglang-overlap gsm8k: error: cannot download GSM8K from "
                                f"{ev.CANONICAL_URL} ("), error
        assert error.endswith("): offline? pass a local test.jsonl with --data-path"), error
        assert not cache.exists() or list(cache.iterdir()) == []
    else:  # online: the public test set, cached; then the closed port is the error
        examples = ev.load_examples(cache / "test.jsonl")
        assert len(examples) == 1319
        lines = (cache / "test.jsonl").read_text().splitlines()
        assert lines[:50] == gsm8k_sample.read_text().splitlines()
        assert error.startswith("sglang-overlap gsm8k: error: cannot reach server"), error
