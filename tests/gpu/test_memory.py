"""tests/gpu/memory.py on the CPU: the workers a card fits, the checks before and after a GPU
test, and each file's largest `gpu_mem` read from its source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu import memory


@pytest.mark.parametrize(("total", "need", "most", "want"), [
    (79.2, 38, 8, 2), (139.8, 38, 8, 3), (79.2, 24, 8, 3), (79.2, 4, 8, 8), (79.2, 4, 1, 1),
    (79.2, 100, 8, 1), (40.0, 38, 8, 1), (78.0, 38, 8, 2), (77.9, 38, 8, 1)])
def test_workers(total: float, need: float, most: int, want: int) -> None:
    assert memory.workers(total, need, most) == want
    n = memory.workers(total, need, most)
    assert n == 1 or n * need <= total - memory.CARD_RESERVE_GIB


def test_check_available() -> None:
    assert memory.check_available("t", 10, free_gib=8.5, held_gib=0.5, total_gib=80) is None
    problem = memory.check_available("tests/gpu/x.py::t", 10, free_gib=8.0, held_gib=0.5,
                                     total_gib=80)
    assert problem is not None and "tests/gpu/x.py::t declares gpu_mem(10)" in problem
    assert "9.5 of the card's 80.0 GiB" in problem and "at most 7 workers" in problem


def test_check_peak() -> None:
    assert memory.check_peak("t", 10, 9.0) is None
    problem = memory.check_peak("t", 10, 9.2)
    assert problem is not None and "declares gpu_mem(10)" in problem and "at least 11" in problem


def test_log_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory.log_peak("t", 4, 1.5)  # no log asked for: nothing written
    log = tmp_path / "mem.jsonl"
    monkeypatch.setenv(memory.LOG_ENV, str(log))
    memory.log_peak("a", 4, 1.23456)
    memory.log_peak("b", 38, 35.7)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows == [{"test": "a", "gpu_mem": 4, "reserved_peak_gib": 1.235},
                    {"test": "b", "gpu_mem": 38, "reserved_peak_gib": 35.7}]


@pytest.mark.parametrize(("source", "need", "most"), [
    ("def test_a(): pass\n", memory.DEFAULT_GIB, memory.MAX_WORKERS),
    ("import pytest\npytestmark = [pytest.mark.gpu, pytest.mark.gpu_mem(10)]\n"
     "def test_a(): pass\n@pytest.mark.gpu_mem(24)\ndef test_b(): pass\n", 24, memory.MAX_WORKERS),
    ("import pytest\npytestmark = pytest.mark.gpu_mem(12)\ndef test_a(): pass\n", 12,
     memory.MAX_WORKERS),
    ("import pytest\n@pytest.mark.gpu_mem(2)\ndef test_a(): pass\ndef test_b(): pass\n"
     "MAX_WORKERS = 1\n", memory.DEFAULT_GIB, 1),
    ("import pytest\npytestmark = [pytest.mark.gpu_mem(30)]\n@pytest.mark.gpu_mem(2)\n"
     "def test_a(): pass\n", 2, memory.MAX_WORKERS),
])
def test_file_need_and_max_workers(tmp_path: Path, source: str, need: float, most: int) -> None:
    path = tmp_path / "test_x.py"
    path.write_text(source)
    assert memory.file_need(path) == need
    assert memory.file_max_workers(path) == most


def test_the_gpu_files_plan(capsys: pytest.CaptureFixture[str]) -> None:
    here = Path(memory.__file__).parent
    assert memory.is_gpu_file(here / "test_sbo_layer.py")
    assert not memory.is_gpu_file(here / "test_memory.py")  # this file: CPU only
    assert memory.main(["--total-gib", "79.2"]) == 0
    listed = capsys.readouterr().out
    assert "test_sbo_layer.py" in listed and "test_memory.py" not in listed, listed
    assert memory.file_need(here / "test_deepgemm_signal.py") == 38
    assert memory.file_max_workers(here / "test_sbo_layer.py") == 1
    assert memory.main(["--total-gib", "79.2", str(here / "test_deepgemm_signal.py")]) == 0
    out = capsys.readouterr().out
    assert "test_deepgemm_signal.py: gpu_mem 38 GiB, 2 workers on 79 GiB: python -m pytest" in out
    assert "-n 2 " in out and out.rstrip().endswith("test_deepgemm_signal.py")


def test_groups_by_workers(capsys: pytest.CaptureFixture[str]) -> None:
    here = Path(memory.__file__).parent
    assert memory.main(["--total-gib", "79.2", "--groups", "--exclude", "test_sbo_layer.py",
                        "--exclude", "test_deepep_kernels.py"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    counts = [int(line[0]) for line in lines]
    assert counts == sorted(set(counts), reverse=True), lines  # one run per count, most first
    named = {Path(f).name: int(line[0]) for line in lines for f in line[1:]}
    # test_signal_down_gemm.py: gpu_mem(28) (26.7 GiB measured on an H100): 2 workers of 29 GiB
    assert named["test_deepgemm_signal.py"] == 2 and named["test_signal_down_gemm.py"] == 2
    assert named["test_gate_timing_gpu.py"] == 1 and named["test_engine_gpu.py"] == 8
    assert "test_sbo_layer.py" not in named and "test_deepep_kernels.py" not in named
    gpu_files = {f.name for f in here.glob("test_*.py") if memory.is_gpu_file(f)}
    assert set(named) == gpu_files - {"test_sbo_layer.py", "test_deepep_kernels.py"}
    planned = [(Path("a"), 4.0, 8), (Path("b"), 38.0, 2), (Path("c"), 4.0, 8)]
    assert memory.groups(planned) == [(8, [Path("a"), Path("c")]), (2, [Path("b")])]
