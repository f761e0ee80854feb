"""Requests a careful client would not send, and what a server answered to each (for
tests/e2e/test_reliability.py): the same probes go to a server with the plugin and one without,
and their outcomes must be equal.

Every request is bounded in time; everything goes to 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

CONTEXT = 4096  # the tiny model's context length (tests/kit/make_tiny_dsv3.py)
TIMEOUT = 300.0


def _ids(n: int, seed: int = 0) -> list[int]:
    """n token ids of the tiny model's byte-level vocabulary (5..1000: no special tokens)."""
    return [5 + (seed + 37 * i) % 995 for i in range(n)]


def _greedy(max_new_tokens: Any, **extra: Any) -> dict[str, Any]:
    return {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **extra}


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


HELLO = "Hello world! What is the capital of France?"
# name -> raw request body for POST /generate. Lengths are in tokens; the context is 4096.
CASES: dict[str, bytes] = {
    # malformed or mistyped JSON
    "malformed_json": b'{"text": "Hello", "sampling_params": {"max_new_tokens": 4',
    "not_json": b"Hello, server",
    "json_list": b"[1, 2, 3]",
    "text_is_a_number": _body(text=12345, sampling_params=_greedy(4)),
    "max_new_tokens_is_a_string": _body(text=HELLO, sampling_params=_greedy("ten")),
    "temperature_is_a_string": _body(text=HELLO, sampling_params={"temperature": "hot"}),
    "sampling_params_is_a_list": _body(text=HELLO, sampling_params=[0, 4]),
    "input_ids_not_ints": _body(input_ids=[17, "a", 42], sampling_params=_greedy(4)),
    "text_and_input_ids": _body(text=HELLO, input_ids=[17, 42], sampling_params=_greedy(4)),
    # empty prompts (the one that ends the server is ENDING_CASE)
    "empty_input_ids": _body(input_ids=[], sampling_params=_greedy(4)),
    # the context's edge
    "past_the_context": _body(input_ids=_ids(CONTEXT + 500), sampling_params=_greedy(4)),
    "at_the_context": _body(input_ids=_ids(CONTEXT), sampling_params=_greedy(4)),
    "prompt_plus_new_tokens_past_the_context": _body(input_ids=_ids(CONTEXT - 4),
                                                     sampling_params=_greedy(8)),
    "longest_prompt_that_fits": _body(input_ids=_ids(CONTEXT - 9), sampling_params=_greedy(8)),
    # max_new_tokens
    "max_new_tokens_0": _body(text=HELLO, sampling_params=_greedy(0)),
    "max_new_tokens_-1": _body(text=HELLO, sampling_params=_greedy(-1)),
    "max_new_tokens_huge": _body(text=HELLO, sampling_params=_greedy(10**9)),
    # 1-3 token prompts: TBO cannot split one token, two-chunk cannot cut it
    "one_token": _body(input_ids=[17], sampling_params=_greedy(6)),
    "two_tokens": _body(input_ids=[17, 42], sampling_params=_greedy(6)),
    "three_tokens": _body(input_ids=[17, 42, 99], sampling_params=_greedy(6)),
    "batch_of_1_2_3_tokens": _body(input_ids=[[17], [17, 42], [17, 42, 99]],
                                   sampling_params=_greedy(6)),
    # one long request and a 1-token one: the balanced cut falls inside the long one (two-chunk)
    "long_and_one_token": _body(input_ids=[_ids(600, seed=3), [17]],
                                sampling_params=_greedy(6)),
}
# Sent last: a prompt of 0 tokens (the tiny tokenizer adds no BOS) run in an extend batch of its
# own ends SGLang 0.5.23's CPU server, with or without the plugin. ("" beside another prompt in one
# request may or may not land in a batch of its own: that depends on timing, so it is not sent.)
ENDING_CASE = _body(text="", sampling_params=_greedy(4))

@dataclass(frozen=True)
class Outcome:
    status: int | None
    """The HTTP status; None when no answer came (refused, reset, timed out)."""
    tokens: tuple[tuple[int, ...], ...] | None = None
    """For a 200 answer: output_ids per prompt."""
    detail: str = ""
    """For anything else: the start of the body, or the exception."""


def _connection(port: int, timeout: float = TIMEOUT) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)


def _tokens(answer: Any) -> tuple[tuple[int, ...], ...]:
    items = answer if isinstance(answer, list) else [answer]
    return tuple(tuple(item["output_ids"]) for item in items)


def post(port: int, body: bytes) -> Outcome:
    conn = _connection(port)
    try:
        conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        return Outcome(None, detail=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    if resp.status != 200:
        return Outcome(resp.status, detail=data[:300].decode(errors="replace"))
    try:
        return Outcome(200, _tokens(json.loads(data)))
    except (ValueError, KeyError, TypeError) as exc:
        return Outcome(200, detail=f"unreadable 200 answer ({exc}): {data[:300]!r}")


def run_cases(port: int) -> dict[str, Outcome]:
    """Every case of CASES, one after the other (each alone in its batch)."""
    return {name: post(port, body) for name, body in CASES.items()}


def _stream(port: int, prompt: str, max_new_tokens: int, drop: bool) -> Outcome:
    """POST a streaming request; read it to the end, or (drop) hang up after the first event."""
    body = _body(text=prompt, stream=True, sampling_params=_greedy(max_new_tokens))
    conn = _connection(port)
    try:
        conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return Outcome(resp.status, detail=resp.read()[:300].decode(errors="replace"))
        last: Any = None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            last = json.loads(line[len("data:"):])
            if drop:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                return Outcome(200, detail="dropped after the first event")
        return Outcome(200, _tokens(last) if last is not None else None)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return Outcome(None, detail=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


STREAM_PROMPTS = [f"Stream {i}: the quick brown fox {i * 7 % 10} jumps over the lazy dog."
                  for i in range(30)]
STREAM_NEW_TOKENS = 24


def streams_with_half_dropped(port: int, prompts: Sequence[str] = STREAM_PROMPTS,
                              max_new_tokens: int = STREAM_NEW_TOKENS) -> dict[int, Outcome]:
    """All prompts streamed at once; the client hangs up on every other one after its first
    event. Returns the outcome of each stream (index -> Outcome)."""
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = {i: pool.submit(_stream, port, p, max_new_tokens, drop=i % 2 == 1)
                   for i, p in enumerate(prompts)}
        return {i: f.result() for i, f in futures.items()}


_TRACEBACK = re.compile(r"Traceback \(most recent call last\):")


def tracebacks(log: str) -> set[str]:
    """The exception line of every traceback in a server log, numbers and hex ids masked."""
    found = set()
    for m in _TRACEBACK.finditer(log):
        for line in log[m.end():].splitlines()[1:]:
            if line and not line[0].isspace() and not line.startswith("Traceback"):
                found.add(re.sub(r"0x[0-9a-f]+|[0-9a-f]{32}|\d+", "N", line.strip())[:200])
                break
    return found
