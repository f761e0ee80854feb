"""Launch configs (sglang_overlap/launch/config.py, commands.py, check_args.py) and
`sglang-overlap launch --dry-run`: every shipped config loads and passes SGLang's own parser,
and every kind of bad config is an error that names the file and the key."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_overlap.cli.main import main
from sglang_overlap.launch.check_args import sglang_errors
from sglang_overlap.launch.commands import process_specs, program_missing
from sglang_overlap.launch.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.toml"))
HAS_SGLANG = importlib.util.find_spec("sglang") is not None

PD = """
[model]
path = "/models/m"
[common]
args = ["--device", "cpu"]
[prefill]
port = 31500
bootstrap_port = 31501
args = ["--disable-overlap-schedule"]
[decode]
port = 31502
[router]
port = 31503
"""


def _write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {"tiny-cpu-pd.toml", "tiny-cpu-single.toml", "h20-pd-deepseek-r1.toml",
            "h800-pd-deepseek-v3.toml", "h200-pd-deepseek-v3.toml",
            "h200-single-deepseek-v3.toml"} <= names, names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path, environ={})
    specs = process_specs(cfg)
    assert [s.name for s in specs] == list(cfg.role_names)
    for spec in specs:
        assert spec.argv[1] in ("serve", "launch"), spec.argv


def test_pd_commands_exact(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, PD), environ={})
    prefill, decode, router = process_specs(cfg)
    assert prefill.argv[1:] == (
        "serve", "--model-path", "/models/m", "--host", "127.0.0.1", "--port", "31500",
        "--device", "cpu", "--disable-overlap-schedule",
        "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "31501")
    assert decode.argv[-2:] == ("--disaggregation-mode", "decode")
    assert router.argv[1:] == (
        "launch", "--host", "127.0.0.1", "--port", "31503", "--pd-disaggregation",
        "--prefill", "http://127.0.0.1:31500", "31501", "--decode", "http://127.0.0.1:31502")
    assert prefill.health_url == "http://127.0.0.1:31500/health"
    assert router.router_workers == ("http://127.0.0.1:31500", "http://127.0.0.1:31502")


def test_variables_expand_and_model_path_overrides(tmp_path: Path) -> None:
    text = PD.replace('"/models/m"', '"${MODELS:-/default}/dsv3"').replace(
        "port = 31502", 'port = 31502\nhost = "0.0.0.0"\nenv = { X = "${X}" }')
    path = _write(tmp_path, text)
    cfg = load_config(path, environ={"MODELS": "/data", "X": "1"})
    assert cfg.model_path == "/data/dsv3"
    assert cfg.role("decode").env == {"X": "1"}
    assert cfg.role("decode").url == "http://127.0.0.1:31502"  # 0.0.0.0 is reached on loopback
    assert load_config(path, environ={"X": "1"}).model_path == "/default/dsv3"
    assert load_config(path, model_path="/cli", environ={"X": "1"}).model_path == "/cli"


def test_multi_node_role_gets_node_rank(tmp_path: Path) -> None:
    text = PD.replace('args = ["--disable-overlap-schedule"]',
                      'args = ["--nnodes", "2", "--dist-init-addr", "10.0.0.1:5757"]')
    cfg = load_config(_write(tmp_path, text), environ={})
    (spec,) = process_specs(cfg, ("prefill",), node_rank=1)
    assert spec.argv[-2:] == ("--node-rank", "1") and spec.health_url is None
    (spec0,) = process_specs(cfg, ("prefill",), node_rank=0)
    assert spec0.health_url is not None
    with pytest.raises(ValueError, match=r"--node-rank 2: \[prefill\] runs on 2 nodes"):
        process_specs(cfg, ("prefill",), node_rank=2)


BAD = [
    # (edit: old -> new, expected message fragments)
    (("[decode]", "[decode]\nportt = 1"), "[decode] portt: unknown key"),
    (("[router]", "[routr]"), "[routr]: unknown table"),
    (("port = 31502", 'port = "31502"'), "[decode] port: must be an integer port"),
    (("port = 31502", "port = 70000"), "[decode] port: must be an integer port in 1..65535"),
    (('args = ["--device", "cpu"]', 'args = "--device cpu"'), "[common] args: must be a list"),
    (('args = ["--device", "cpu"]', "args = [true]"), "[common] args[0]: must be a string"),
    (('args = ["--disable-overlap-schedule"]', 'args = ["--port", "1"]'),
     "[prefill] args: --port is set by the launcher"),
    (('args = ["--disable-overlap-schedule"]', 'args = ["--model-path", "x"]'),
     "[prefill] args: --model-path is [model] path"),
    (('args = ["--device", "cpu"]', 'args = ["--disaggregation-mode", "decode"]'),
     "[common] args: --disaggregation-mode is set by the launcher"),
    (('args = ["--disable-overlap-schedule"]', 'args = ["--device", "cuda"]'),
     "[prefill] args: --device is also in [common] args"),
    (("port = 31502", "port = 31500"), "[decode] port: port 31500 on 127.0.0.1 is already"),
    (("port = 31503", "port = 31501"), "[router] port: port 31501 on 127.0.0.1 is already "
                                       "[prefill] bootstrap_port"),
    (("[decode]\nport = 31502", ""), "[decode]: missing: PD disaggregation needs"),
    (("[prefill]", "[server]\nport = 31600\n[prefill]"), "[server]: contradicts [prefill]"),
    (('"/models/m"', '"${NOPE}/m"'), "[model] path: ${NOPE} is not set"),
    (('path = "/models/m"', ""), "[model] path: missing (or pass --model-path)"),
    (('args = ["--disable-overlap-schedule"]', 'args = ["--nnodes", "2"]'),
     "[prefill] args: --nnodes 2 needs --dist-init-addr"),
    (("[router]\nport = 31503", "[launch]\nready_timeout = -1"),
     "[launch] ready_timeout: must be a positive number"),
    (("[router]", "[router"), "not valid TOML"),
    (('args = ["--disable-overlap-schedule"]', 'args = ["--nnodes", "two"]'),
     "[prefill] args: --nnodes must be a positive integer (got 'two')"),
]


@pytest.mark.parametrize(("edit", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_config_names_file_and_key(tmp_path: Path, edit: tuple[str, str],
                                       message: str) -> None:
    old, new = edit
    assert old in PD, old
    path = _write(tmp_path, PD.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text, text


def test_single_server_with_router_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, '[model]\npath = "m"\n[server]\nport = 31600\n[router]\nport = 31601\n')
    with pytest.raises(ConfigError, match=r"\[router\]: needs \[prefill\] and \[decode\]"):
        load_config(path, environ={})


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "none.toml")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "sglang_overlap", "launch", *args],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_cli_bad_config_is_one_line_exit_2(tmp_path: Path) -> None:
    path = _write(tmp_path, PD.replace("port = 31502", 'port = "x"'))
    proc = _cli(str(path), "--dry-run")
    assert proc.returncode == 2, proc
    assert proc.stderr.strip() == (
        f"sglang-overlap launch: error: {path}: [decode] port: must be an integer port in "
        "1..65535 (got 'x')")
    assert "Traceback" not in proc.stderr


def test_cli_dry_run_prints_exact_commands(tmp_path: Path) -> None:
    proc = _cli(str(REPO / "configs" / "tiny-cpu-pd.toml"), "--dry-run", "--no-validate",
                "--model-path", "/tmp/some-model")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("#")] == [
        "# prefill: ready when GET http://127.0.0.1:31000/health answers 200",
        "# decode: ready when GET http://127.0.0.1:31001/health answers 200",
        "# router: ready when GET http://127.0.0.1:31080/workers lists http://127.0.0.1:31000, "
        "http://127.0.0.1:31001",
    ]
    assert lines[1].startswith("env SGLANG_USE_CPU_ENGINE=1 ")
    assert "serve --model-path /tmp/some-model --host 127.0.0.1 --port 31000" in lines[1]
    assert lines[5].endswith("--decode http://127.0.0.1:31001 --prometheus-host 127.0.0.1 "
                             "--prometheus-port 31081")
    proc = _cli(str(REPO / "configs" / "tiny-cpu-pd.toml"), "--dry-run", "--no-validate",
                "--only", "routr")
    assert proc.returncode == 2 and "no role 'routr'" in proc.stderr


@pytest.fixture
def no_programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where neither sglang nor smg is installed: an empty environment bin/ and PATH."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


def test_dry_run_needs_no_program(no_programs: None, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(_write(tmp_path, PD), environ={})
    assert [s.argv[0] for s in process_specs(cfg)] == ["sglang", "sglang", "smg"]
    assert main(["launch", str(cfg.path), "--dry-run", "--no-validate"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("sglang serve --model-path /models/m ")
    assert out[5].startswith("smg launch --host 127.0.0.1 --port 31503 --pd-disaggregation ")


def test_launch_without_a_program_starts_nothing(no_programs: None, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(_write(tmp_path, PD), environ={})
    log_dir = tmp_path / "logs"
    assert main(["launch", str(cfg.path), "--no-validate", "--log-dir", str(log_dir)]) == 1
    err = capsys.readouterr().err.splitlines()
    where = f"not found next to {tmp_path / 'bin' / 'python'} or on PATH"
    assert err == [
        f"sglang-overlap launch: error: prefill: 'sglang' {where} (pip install sglang==0.5.23)",
        f"sglang-overlap launch: error: decode: 'sglang' {where} (pip install sglang==0.5.23)",
        f"sglang-overlap launch: error: router: 'smg' {where} (pip install smg)",
        "sglang-overlap launch: error: nothing was started",
    ]
    assert not log_dir.exists()


def test_router_program_is_the_environments_smg_when_installed(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    smg = bin_dir / "smg"
    smg.write_text("#!/bin/sh\n")
    smg.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    cfg = load_config(_write(tmp_path, PD), environ={})
    router = process_specs(cfg)[-1]
    assert router.argv[0] == str(smg) and program_missing(router) is None


@pytest.mark.skipif(not HAS_SGLANG, reason="sglang not installed")
def test_sglang_parser_accepts_shipped_and_rejects_bad(tmp_path: Path) -> None:
    """One child Python runs SGLang's parser (with the plugin's flags) over every shipped config
    and a few bad ones; errors name the file, the args key and SGLang's or the plugin's words."""
    shipped = [load_config(p, environ={}) for p in CONFIGS]
    bad_text = {
        "unknown-flag": (PD.replace('args = ["--disable-overlap-schedule"]', "")
                         .replace("port = 31502", 'port = 31502\nargs = ["--bogus-flag"]')),
        "sbo-without-a2a": PD.replace(
            'args = ["--device", "cpu"]',
            'args = ["--device", "cpu", "--enable-single-batch-overlap"]'),
        "bad-choice": PD.replace('args = ["--disable-overlap-schedule"]',
                                 'args = ["--overlap-gating", "sometimes"]'),
    }
    bad = [load_config(_write(tmp_path, t, f"{k}.toml"), environ={}) for k, t in bad_text.items()]
    errors = sglang_errors(shipped + bad)
    assert errors[: len(shipped)] == [None] * len(shipped), errors
    unknown, sbo, choice = errors[len(shipped):]
    assert unknown == (f"{tmp_path}/unknown-flag.toml: [decode] args: unrecognized arguments: "
                       "--bogus-flag"), unknown
    assert sbo is not None and sbo.startswith(f"{tmp_path}/sbo-without-a2a.toml: [common] args: ")
    assert "--enable-single-batch-overlap needs" in sbo, sbo
    assert choice is not None and "[prefill] args: argument --overlap-gating" in choice, choice
