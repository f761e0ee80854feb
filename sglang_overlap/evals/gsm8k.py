"""Few-shot GSM8K against a running SGLang server (or router), SGLang's own convention.

The convention is the supported SGLang's `sglang.test.few_shot_gsm8k`, so numbers compare with
upstream's:
  * the k few-shot examples are the first k lines of test.jsonl, each formatted
    "Question: {q}\\nAnswer: {full worked answer}" and joined with blank lines;
  * question i (the first `num_questions` lines, overlapping the shots, as upstream) is
    "Question: {q}\\nAnswer:" appended to that prefix;
  * greedy decoding (temperature 0), up to 512 new tokens, stop on "Question", "Assistant:",
    "<|separator|>";
  * the answer is the last run of digits after removing commas (so "-3" reads 3 and "2.5"
    reads 5, exactly as upstream), no digits = invalid.

Pure Python: the HTTP client is urllib, requests run on a thread pool. No torch, no sglang.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CANONICAL_URL = (
    "https://raw.githubusercontent.com/openai/grade-school-math/master/"
    "grade_school_math/data/test.jsonl"
)
STOP = ("Question", "Assistant:", "<|separator|>")
_DIGITS = re.compile(r"\d+")


class EvalError(RuntimeError):
    """A problem the user can fix (bad data file, unreachable server); the message is one line."""


@dataclass(frozen=True)
class Example:
    question: str
    answer: str
    """The full worked solution, ending in "#### <number>"."""
    label: int


def extract_answer(text: str) -> int | None:
    """The last integer in `text` (commas removed), or None when there is none."""
    numbers = _DIGITS.findall(text.replace(",", ""))
    return int(numbers[-1]) if numbers else None


def load_examples(path: str | Path) -> list[Example]:
    """Read a GSM8K jsonl file ({"question": ..., "answer": "... #### N"} per line)."""
    p = Path(path)
    if not p.is_file():
        raise EvalError(f"GSM8K data file not found: {p} (--data-path)")
    examples = []
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question, answer = str(row["question"]), str(row["answer"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise EvalError(
                f"{p}:{lineno}: not a GSM8K record with 'question' and 'answer' ({exc})"
            ) from exc
        label = extract_answer(answer)
        if label is None:
            raise EvalError(f"{p}:{lineno}: the reference answer has no integer")
        examples.append(Example(question, answer, label))
    if not examples:
        raise EvalError(f"{p}: no GSM8K records")
    return examples


def default_cache_dir() -> Path:
    """Where the downloaded test set is kept: $XDG_CACHE_HOME (else ~/.cache)/sglang-overlap."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-overlap"


def fetch_canonical(cache_dir: Path, url: str = CANONICAL_URL, timeout: float = 30.0) -> Path:
    """The public GSM8K test.jsonl, downloaded once into `cache_dir` (as SGLang's
    few_shot_gsm8k.py does, which keeps it in /tmp); later calls read the cached copy. A download
    that is not GSM8K (a proxy's error page, a cut-off file) is refused and not cached."""
    target = cache_dir / "gsm8k" / "test.jsonl"
    if target.is_file():
        return target
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data = resp.read()
    except urllib.error.HTTPError as exc:
        raise EvalError(f"cannot download GSM8K from {url} (HTTP {exc.code}); pass a local "
                        "test.jsonl with --data-path") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EvalError(f"cannot download GSM8K from {url} ({reason}): offline? pass a local "
                        "test.jsonl with --data-path") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(f".part{os.getpid()}")
    part.write_bytes(data)
    try:
        load_examples(part)
    except EvalError as exc:
        part.unlink()
        raise EvalError(f"the download from {url} is not GSM8K ({exc}); pass a local "
                        "test.jsonl with --data-path") from exc
    part.replace(target)
    return target


def format_example(question: str, answer: str | None = None) -> str:
    text = "Question: " + question + "\nAnswer:"
    return text if answer is None else text + " " + answer


def few_shot_prefix(examples: Sequence[Example], num_shots: int) -> str:
    if not 0 <= num_shots <= len(examples):
        raise EvalError(f"--num-shots must be in [0, {len(examples)}] (got {num_shots})")
    return "".join(format_example(e.question, e.answer) + "\n\n" for e in examples[:num_shots])


def build_prompts(examples: Sequence[Example], num_questions: int, num_shots: int) -> list[str]:
    """The prompts for the first `num_questions` questions, each behind the same few shots."""
    if num_questions < 1:
        raise EvalError(f"--num-questions must be >= 1 (got {num_questions})")
    prefix = few_shot_prefix(examples, num_shots)
    return [prefix + format_example(e.question) for e in examples[:num_questions]]


# --- HTTP -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    text: str
    completion_tokens: int
    latency_s: float
    error: str | None = None


def _request(url: str, payload: dict[str, Any] | None, timeout: float) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode() or "null")


def check_reachable(base_url: str, timeout: float = 10.0) -> None:
    """Raise EvalError (one line) unless `base_url`/health answers 200."""
    try:
        _request(base_url.rstrip("/") + "/health", None, timeout)
    except json.JSONDecodeError:
        return  # /health answers 200 with a non-JSON body: reachable
    except urllib.error.HTTPError as exc:
        raise EvalError(f"server at {base_url} is not healthy: /health -> HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EvalError(f"cannot reach server at {base_url}: {reason}") from exc


def generate(base_url: str, prompt: str, max_new_tokens: int, timeout: float) -> Completion:
    payload = {
        "text": prompt,
        "sampling_params": {
            "temperature": 0,
            "max_new_tokens": max_new_tokens,
            "stop": list(STOP),
        },
    }
    tic = time.perf_counter()
    try:
        out = _request(base_url.rstrip("/") + "/generate", payload, timeout)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:200]
        return Completion("", 0, time.perf_counter() - tic, f"HTTP {exc.code}: {body}")
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        return Completion("", 0, time.perf_counter() - tic, f"{type(exc).__name__}: {exc}")
    meta = out.get("meta_info", {}) if isinstance(out, dict) else {}
    text = out.get("text", "") if isinstance(out, dict) else ""
    return Completion(str(text), int(meta.get("completion_tokens", 0)), time.perf_counter() - tic)


def run_requests(
    base_url: str,
    prompts: Sequence[str],
    *,
    parallel: int,
    max_new_tokens: int,
    timeout: float = 600.0,
    on_done: Callable[[], None] | None = None,
) -> tuple[list[Completion], float]:
    """Send every prompt with `parallel` requests in flight; return completions (prompt order)
    and the wall time."""
    results: list[Completion | None] = [None] * len(prompts)
    tic = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=max(1, parallel))
    try:
        futures = {
            pool.submit(generate, base_url, p, max_new_tokens, timeout): i
            for i, p in enumerate(prompts)
        }
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            if on_done is not None:
                on_done()
    finally:
        # On Ctrl-C, drop the queued requests instead of sending them all first.
        pool.shutdown(wait=False, cancel_futures=True)
    wall = time.perf_counter() - tic
    return [r for r in results if r is not None], wall


# --- scoring --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalResult:
    url: str
    labels: tuple[int, ...]
    preds: tuple[int | None, ...]
    outputs: tuple[str, ...]
    output_tokens: int
    latency_s: float
    """Wall time of the whole run."""
    errors: tuple[str, ...]
    """One entry per failed request ("question i: reason")."""

    @property
    def num_questions(self) -> int:
        return len(self.labels)

    @property
    def correct(self) -> tuple[bool, ...]:
        return tuple(p == y for p, y in zip(self.preds, self.labels, strict=True))

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / self.num_questions

    @property
    def invalid_rate(self) -> float:
        return sum(p is None for p in self.preds) / self.num_questions

    @property
    def output_throughput(self) -> float:
        """Generated tokens per second of wall time."""
        return self.output_tokens / self.latency_s if self.latency_s > 0 else 0.0

    def records(self) -> list[dict[str, Any]]:
        """One record per question, for inspecting answers."""
        return [
            {"url": self.url, "question": i, "label": y, "pred": p, "correct": p == y,
             "output": o}
            for i, (y, p, o) in enumerate(zip(self.labels, self.preds, self.outputs, strict=True))
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "num_questions": self.num_questions,
            "accuracy": self.accuracy,
            "invalid": self.invalid_rate,
            "latency_s": self.latency_s,
            "output_tokens": self.output_tokens,
            "output_throughput": self.output_throughput,
            "errors": list(self.errors),
        }


def score(
    url: str, examples: Sequence[Example], completions: Sequence[Completion], wall_s: float
) -> EvalResult:
    """Score completions of the first len(completions) examples."""
    errors = tuple(f"question {i}: {c.error}" for i, c in enumerate(completions) if c.error)
    return EvalResult(
        url=url,
        labels=tuple(e.label for e in examples[: len(completions)]),
        preds=tuple(None if c.error else extract_answer(c.text) for c in completions),
        outputs=tuple(c.text for c in completions),
        output_tokens=sum(c.completion_tokens for c in completions),
        latency_s=wall_s,
        errors=errors,
    )


def paired_difference(
    a: Sequence[bool], b: Sequence[bool], z: float = 1.96
) -> tuple[float, float, float]:
    """acc(a) - acc(b) on the same questions, with a Wald interval for paired proportions.

    With n10 questions only `a` got right and n01 only `b` got right, d = (n10 - n01) / n and
    Var(d) = ((n10 + n01) / n - d^2) / n (McNemar's setting: questions both got right or both
    got wrong carry no information about the difference). Returns (d, low, high).
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"need two equal, non-empty sets of answers (got {len(a)}, {len(b)})")
    n = len(a)
    n10 = sum(x and not y for x, y in zip(a, b, strict=True))
    n01 = sum(y and not x for x, y in zip(a, b, strict=True))
    d = (n10 - n01) / n
    half = z * math.sqrt(max(0.0, (n10 + n01) / n - d * d) / n)
    return d, d - half, d + half


@dataclass(frozen=True)
class Comparison:
    a: EvalResult
    """The server under test (--url: overlap on)."""
    b: EvalResult
    """The reference server (--compare-url: overlap off)."""

    @property
    def difference(self) -> tuple[float, float, float]:
        """acc(a) - acc(b) and its 95% interval."""
        return paired_difference(self.a.correct, self.b.correct)

    @property
    def answer_agreement(self) -> float:
        """Fraction of questions whose extracted answers are identical (both invalid counts)."""
        same = sum(x == y for x, y in zip(self.a.preds, self.b.preds, strict=True))
        return same / self.a.num_questions

    @property
    def text_agreement(self) -> float:
        """Fraction of questions whose generated texts are identical."""
        same = sum(x == y for x, y in zip(self.a.outputs, self.b.outputs, strict=True))
        return same / self.a.num_questions

    def disagreements(self) -> list[int]:
        pairs = zip(self.a.preds, self.b.preds, strict=True)
        return [i for i, (x, y) in enumerate(pairs) if x != y]

    def to_dict(self) -> dict[str, Any]:
        d, lo, hi = self.difference
        return {
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "accuracy_difference": d,
            "ci95": [lo, hi],
            "answer_agreement": self.answer_agreement,
            "text_agreement": self.text_agreement,
            "disagreeing_questions": self.disagreements(),
        }
