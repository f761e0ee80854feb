"""What careless or hostile clients send, against real SGLang servers running the plugin's overlap
modes (TBO + two-chunk, SBO, automatic gating; --tp 2 over torch_a2a) and against the same server
without the plugin (plain --tp 2, SGLANG_PLUGINS=cpu_shim). Tiny random DeepSeek-V3, CPU.

Sent (tests/e2e/probes.py): malformed and mistyped JSON; empty prompts; prompts at and past the
context, and the longest that fits; max_new_tokens 0, -1 and 10**9; prompts of 1, 2 and 3 tokens,
alone and as one batch (TBO cannot split them); one long prompt beside a 1-token one (the balanced
cut falls inside the long one: two-chunk); 30 streams at once, of which the client drops every
other after its first event. Every overlap server answers each with the HTTP status, the error
text and the greedy tokens of the server without the plugin, answers afterwards as before, and
logs no traceback that the server without the plugin does not.

Found doing so, in SGLang 0.5.23 itself (plugin or not): a prompt of zero tokens (text "" with a
tokenizer that adds no BOS, as the tiny model's) that the scheduler runs in an extend batch of its
own kills the server - plain TP in moe_forward_native ("cannot reshape tensor of 0 elements"),
the DeepEP-style path in the logits processor ("index is out of bounds for dimension with size
0"). `input_ids: []` is refused (400); "" is not. It is sent last (probes.ENDING_CASE).
"""

from __future__ import annotations

import probes
import pytest
from overlap_runs import OverlapRuns, Probes

pytestmark = pytest.mark.e2e

MODES = ["tbo", "sbo", "auto"]
BASELINE = "plain_without_plugin"


def _probes(runs: OverlapRuns, name: str) -> Probes:
    found = runs[name].probes
    assert found is not None, f"{name} was not probed (overlap_runs.PROBED)"
    return found


@pytest.mark.parametrize("case", list(probes.CASES))
@pytest.mark.parametrize("mode", MODES)
def test_same_answer_as_without_the_plugin(overlap_runs: OverlapRuns, mode: str,
                                           case: str) -> None:
    want = _probes(overlap_runs, BASELINE).cases[case]
    got = _probes(overlap_runs, mode).cases[case]
    assert want.status is not None, f"the server without the plugin did not answer: {want=}"
    assert got == want, f"{mode=} {case=}\n{got=}\n{want=}"


def test_the_probes_cover_what_they_claim(overlap_runs: OverlapRuns) -> None:
    """The baseline's answers are what each case is meant to provoke (else the test is idle)."""
    cases = _probes(overlap_runs, BASELINE).cases
    refused = {name for name, o in cases.items() if o.status == 400}
    assert refused == {
        "malformed_json", "not_json", "json_list", "text_is_a_number",
        "max_new_tokens_is_a_string", "temperature_is_a_string", "sampling_params_is_a_list",
        "input_ids_not_ints", "empty_input_ids", "past_the_context", "at_the_context",
        "prompt_plus_new_tokens_past_the_context", "max_new_tokens_-1", "max_new_tokens_huge",
    }, refused
    served = {name: o.tokens for name, o in cases.items() if o.status == 200}
    assert set(served) == set(cases) - refused
    assert served["max_new_tokens_0"] == ((),)
    assert [len(t) for t in served["batch_of_1_2_3_tokens"]] == [6, 6, 6]
    assert served["batch_of_1_2_3_tokens"] == (served["one_token"] + served["two_tokens"]
                                               + served["three_tokens"])
    assert [len(t) for t in served["long_and_one_token"]] == [6, 6]
    assert served["long_and_one_token"][1] == served["one_token"][0]
    # Accepted (4087 + 8 <= 4096), yet SGLang 0.5.23's scheduler clips max_new_tokens to
    # context - 2 - prompt = 7, plugin or not.
    assert [len(t) for t in served["longest_prompt_that_fits"]] == [7]


@pytest.mark.parametrize("mode", MODES)
def test_dropped_streams_leave_the_others_and_the_server_intact(overlap_runs: OverlapRuns,
                                                                mode: str) -> None:
    want, got = _probes(overlap_runs, BASELINE), _probes(overlap_runs, mode)
    for i, (w, g) in enumerate(zip(want.streams.values(), got.streams.values(), strict=True)):
        if i % 2:  # dropped by the client after its first event
            assert g.status == w.status == 200, f"{mode=} stream {i}: {g=} {w=}"
        else:
            assert w.tokens is not None and len(w.tokens[0]) == probes.STREAM_NEW_TOKENS, w
            assert g == w, f"{mode=} stream {i}:\n{g=}\n{w=}"
    before = got.cases["batch_of_1_2_3_tokens"]
    assert got.after == before == want.after, f"{mode=}: after the streams {got.after=}"


@pytest.mark.parametrize("mode", MODES)
def test_no_traceback_the_server_without_the_plugin_does_not_log(overlap_runs: OverlapRuns,
                                                                 mode: str) -> None:
    extra = probes.tracebacks(overlap_runs[mode].log) - probes.tracebacks(
        overlap_runs[BASELINE].log)
    assert not extra, f"{mode=}: {sorted(extra)}"


@pytest.mark.parametrize("mode", MODES)
def test_zero_token_prompt_fares_as_without_the_plugin(overlap_runs: OverlapRuns,
                                                       mode: str) -> None:
    """SGLang 0.5.23's own crash (module docstring): the plugin must not change the outcome."""
    want = _probes(overlap_runs, BASELINE).ending
    got = _probes(overlap_runs, mode).ending
    assert got.status == want.status, f"{mode=} {got=} {want=}"
