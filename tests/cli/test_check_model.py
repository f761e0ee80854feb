"""`sglang-overlap check` and the served model: refused by name, by a local, cached or downloaded
config.json, or not checked (one line, never "ready"). No test reaches huggingface.co: the
offline ones set HF_HUB_OFFLINE=1, the download ones run a Hub on 127.0.0.1 (HF_ENDPOINT)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_overlap.cli.check_model import known_architecture
from sglang_overlap.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TBO = ["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep", "--tp", "2",
       "--assume-arch", "sm90", "--no-import-check"]
QWEN = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}
QWEN_REFUSAL = ("--enable-two-batch-overlap (TBO), two-chunk (TBO with "
                "--tbo-token-distribution-threshold > 0) is not supported on Qwen3MoeForCausalLM "
                "(SGLang's Qwen3-MoE has its own MoE layer")
POINT = "point --model-path at a local folder holding its config.json"
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # nothing cached


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["check", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc, out, _ = _check(capsys, "--json", *argv)
    return rc, json.loads(out[out.index("{"):])


def _folder(tmp_path: Path, config: object, name: str = "m") -> str:
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(
        config if isinstance(config, str) else json.dumps(config))
    return str(tmp_path / name)


@pytest.mark.parametrize(("path", "arch"), [
    ("deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM"),
    ("deepseek-ai/deepseek-r1", "DeepseekV3ForCausalLM"),
    ("deepseek-ai/DeepSeek-V2-Lite", "DeepseekV2ForCausalLM"),
    ("Qwen/Qwen3-30B-A3B", "Qwen3MoeForCausalLM"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", None),  # a Qwen2: the name alone is not enough
    ("DeepSeek-V3", None), ("a/b/DeepSeek-V3", None), ("/DeepSeek-V3", None),
])
def test_models_known_by_name(path: str, arch: str | None) -> None:
    assert known_architecture(path) == arch


def test_a_local_folder_is_never_known_by_name(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deepseek-ai" / "DeepSeek-V3").mkdir(parents=True)
    assert known_architecture("deepseek-ai/DeepSeek-V3") is None


def test_a_known_refused_model_is_refused_offline(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    """By name, with no config.json anywhere, and from a local folder: the same one line."""
    rc, out, err = _check(capsys, "--model-path", "Qwen/Qwen3-30B-A3B", *TBO)
    assert rc == 2 and out == "", out
    assert err.startswith(f"sglang-overlap check: error: {QWEN_REFUSAL}") and err.count("\n") == 1
    rc, out, err2 = _check(capsys, "--model-path", _folder(tmp_path, QWEN), *TBO)
    assert rc == 2 and out == "" and err2 == err


def test_a_known_proven_model_is_ready_offline(capsys: pytest.CaptureFixture[str]) -> None:
    """What .ci/run asks: the quick start's check answers without a download."""
    rc, out, _ = _check(capsys, "--model-path", "deepseek-ai/DeepSeek-V3", "--tp", "16",
                        "--moe-a2a-backend", "deepep", "--enable-two-batch-overlap",
                        "--enable-single-batch-overlap", "--overlap-gating", "auto",
                        "--assume-arch", "sm90")
    lines = out.splitlines()
    assert rc <= 1 and any(line.startswith("TBO: on (deepep") for line in lines), out
    assert any(": plugin sglang_overlap " in line for line in lines), out
    assert ("model deepseek-ai/DeepSeek-V3: DeepseekV3ForCausalLM (known by name; config.json "
            "not read)") in lines


def test_the_full_check_of_a_known_model_offline(capsys: pytest.CaptureFixture[str]) -> None:
    """.ci/run's `check --json --full --model-path deepseek-ai/DeepSeek-V3`."""
    pytest.importorskip("sglang")
    rc, report = _json(capsys, "--full", "--model-path", "deepseek-ai/DeepSeek-V3")
    assert report["sglang"]["guard"] == "ok" and report["sglang"]["plugin_loaded"], report
    assert rc == 0 and report["model"] is None  # no mode asked: the model is not looked at
    rc, report = _json(capsys, "--full", "--model-path", "deepseek-ai/DeepSeek-V3",
                       "--enable-two-batch-overlap", "--moe-a2a-backend", "deepep", "--tp", "16")
    assert report["model"]["architecture"] == "DeepseekV3ForCausalLM", report["model"]
    assert report["flags"]["read_by"].startswith("SGLang's parser")


def test_an_unseen_model_is_one_line_and_not_ready(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _check(capsys, "--model-path", "sglang-overlap-tests/no-such-model", *TBO)
    lines = out.splitlines()
    assert rc == 1 and lines[-1] == "NOT READY for these flags" and "ready" not in lines
    assert [line for line in lines if line.startswith("model ")] == [
        "model sglang-overlap-tests/no-such-model: not checked: its config.json could not be "
        f"downloaded (offline: HF_HUB_OFFLINE is set); {POINT}"]
    rc, report = _json(capsys, "--model-path", "sglang-overlap-tests/no-such-model", *TBO)
    assert rc == 1 and report["ok"] is False
    assert report["model"] == {
        "path": "sglang-overlap-tests/no-such-model", "checked": False, "source": None,
        "architecture": None,
        "problem": "its config.json could not be downloaded (offline: HF_HUB_OFFLINE is set)"}


@pytest.mark.parametrize(("make", "problem"), [
    (lambda tmp: str(tmp / "no-such-folder"), "no such folder on this machine"),
    (lambda tmp: str(tmp), "the folder holds no config.json"),
    (lambda tmp: __file__, "a file, not a folder holding config.json"),
])
def test_a_local_path_without_a_config(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       make: Any, problem: str) -> None:
    path = make(tmp_path)
    rc, out, _ = _check(capsys, "--model-path", path, *TBO)
    assert rc == 1 and f"model {path}: not checked: {problem}; {POINT}\n" in out, out


def test_no_mode_asked_no_model_check(capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = _json(capsys, "--model-path", "sglang-overlap-tests/no-such-model",
                       "--assume-arch", "sm90")
    assert rc == 0 and report["ok"] and report["model"] is None


def test_a_proven_local_config_names_its_file(capsys: pytest.CaptureFixture[str],
                                              tiny_dsv3: Path) -> None:
    rc, report = _json(capsys, "--model-path", str(tiny_dsv3), *TBO)
    assert rc == 0 and report["model"] == {
        "path": str(tiny_dsv3), "checked": True, "architecture": "DeepseekV3ForCausalLM",
        "source": f"config.json from {tiny_dsv3}", "problem": None}


@pytest.mark.parametrize(("config", "why"), [
    ('{"architectures":', "config.json is not JSON (Expecting value: line 1 column 18"),
    ("[1, 2]", "config.json is not a JSON object (got list)"),
    ({"architectures": "DeepseekV3ForCausalLM"}, 'config.json: "architectures" must be a list '
     "of class names (got 'DeepseekV3ForCausalLM')"),
])
@pytest.mark.parametrize("full", [False, True])
def test_a_broken_config_is_one_error_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           config: object, why: str, full: bool) -> None:
    if full:
        pytest.importorskip("sglang")
    path = _folder(tmp_path, config)
    rc, out, err = _check(capsys, "--model-path", path, *TBO, *(["--full"] if full else []))
    assert rc == 2 and out == "" and "Traceback" not in err, err
    if full:  # --full imports SGLang here: its import-time warnings come first
        err = err.splitlines(keepends=True)[-1]
    assert err.count("\n") == 1, err
    assert err.startswith(f"sglang-overlap check: error: --model-path {path}: {path}/{why}"), err


# A Hugging Face Hub on 127.0.0.1: config.json of the repositories in CONFIGS, 404 for others.
CONFIGS = {"org/qwen-finetune": QWEN, "org/llama": {"architectures": ["LlamaForCausalLM"]},
           "org/dsv3-ft": {"architectures": ["DeepseekV3ForCausalLM"]}}


class _Hub(http.server.BaseHTTPRequestHandler):
    def _answer(self, body: bool) -> None:
        repo = "/".join(self.path.split("/")[1:3])
        data = json.dumps(CONFIGS[repo]).encode() if repo in CONFIGS else b""
        self.send_response(200 if repo in CONFIGS else 404)
        if repo in CONFIGS:
            self.send_header("ETag", '"e1"')
            self.send_header("X-Repo-Commit", SHA)
        else:
            self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._answer(False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(True)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _cli(endpoint: str, cache: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`check` in a fresh process: huggingface_hub reads HF_ENDPOINT when imported."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "sglang_overlap", "check", *argv], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("full", [False, True])
def test_a_downloaded_config_of_a_refused_model_is_one_line(hub: str, tmp_path: Path,
                                                           full: bool) -> None:
    if full:
        pytest.importorskip("sglang")
    done = _cli(hub, tmp_path, "--model-path", "org/qwen-finetune", *TBO,
                *(["--full"] if full else []))
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]  # --full: SGLang's import-time warnings come first
    assert last.startswith(f"sglang-overlap check: error: {QWEN_REFUSAL}"), done.stderr
    assert full or done.stderr == last + "\n", done.stderr[-3000:]
    done = _cli(hub, tmp_path, "--model-path", "org/llama", *TBO)
    assert done.returncode == 2 and "is not supported on LlamaForCausalLM (not in the plugin's " \
        "table of proven models)" in done.stderr, done.stderr[-3000:]


def test_a_downloaded_proven_config_is_ready_then_cached(hub: str, tmp_path: Path) -> None:
    done = _cli(hub, tmp_path, "--model-path", "org/dsv3-ft", *TBO)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert ("model org/dsv3-ft: DeepseekV3ForCausalLM (config.json from the Hugging Face "
            "Hub (downloaded))") in done.stdout.splitlines()
    cached = _cli("http://127.0.0.1:9", tmp_path, "--model-path", "org/dsv3-ft", *TBO)
    assert cached.returncode == 0, cached.stdout + cached.stderr[-3000:]
    assert ("model org/dsv3-ft: DeepseekV3ForCausalLM (config.json from the Hugging Face "
            "cache)") in cached.stdout.splitlines()


@pytest.mark.parametrize(("endpoint", "problem"), [
    (None, "(no repository org/missing on the Hugging Face Hub, or it is private)"),
    ("http://127.0.0.1:9", "(offline: the Hugging Face Hub cannot be reached)"),
])
def test_a_failed_download_says_why(hub: str, tmp_path: Path, endpoint: str | None,
                                    problem: str) -> None:
    done = _cli(endpoint or hub, tmp_path, "--model-path", "org/missing", *TBO)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert (f"model org/missing: not checked: its config.json could not be downloaded {problem}; "
            f"{POINT}") in done.stdout.splitlines(), done.stdout
    assert done.stdout.endswith("NOT READY for these flags\n")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_hub_is_told_by_one_connection_attempt() -> None:
    """huggingface_hub retries an unreachable Hub for ~23 s; `check` tries one connection."""
    from sglang_overlap.cli.check_model import hub_unreachable

    port = _closed_port()
    t0 = time.monotonic()
    assert hub_unreachable(f"http://127.0.0.1:{port}", {}) == "ConnectionRefusedError"
    assert time.monotonic() - t0 < 2
    with socket.socket() as s:  # a host that answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert hub_unreachable(f"http://127.0.0.1:{s.getsockname()[1]}", {}) is None
    # behind a proxy only a download can tell; no host or a bad port: the download names it
    assert hub_unreachable(f"http://127.0.0.1:{port}", {"https_proxy": "http://p:3128"}) is None
    assert hub_unreachable(f"http://127.0.0.1:{port}", {"HTTPS_PROXY": ""}) == \
        "ConnectionRefusedError"
    assert hub_unreachable("not a url", {}) is None
    assert hub_unreachable("http://127.0.0.1:x/", {}) is None


def test_an_unreachable_hub_is_not_downloaded_from(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants

    from sglang_overlap.cli import check_model

    def download(*args: object, **kwargs: object) -> str:
        raise AssertionError("a download was tried (its retries take ~23 s)")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    for k in (*check_model.PROXY_ENV, *check_model.OFFLINE_ENV):
        monkeypatch.delenv(k, raising=False)
    assert check_model._download("org/missing", None) == (
        None, "its config.json could not be downloaded (offline: the Hugging Face Hub cannot be "
              "reached)")
