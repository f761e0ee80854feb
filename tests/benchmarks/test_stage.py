"""benchmarks/serve/stage.py on the CPU: a kit of real parts (random bytes, split like
build_kit.sh splits its payload) received one call at a time, checked, assembled."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "benchmarks" / "serve" / "stage.py"
PART = 1000


def make_kit(kit: Path, files: dict[str, bytes], kit_id: str = "k1") -> list[Path]:
    """What build_kit.sh writes: kit.json and parts/part-NN of an uncompressed tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    (kit / "parts").mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(0, len(blob), PART):
        p = kit / "store" / f"part-{i // PART:02d}"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(blob[i:i + PART])
        parts.append(p)
    (kit / "kit.json").write_text(json.dumps({
        "format": 1, "kit": kit_id, "payload_bytes": len(blob),
        "parts": [{"name": p.name, "bytes": p.stat().st_size,
                   "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in parts],
        "contents": {n: len(d) for n, d in files.items()}}))
    return parts


def stage(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KIT": str(tmp / "kit"), "GK": str(tmp / "gk")}
    return subprocess.run([sys.executable, str(STAGE), *args], capture_output=True, text=True,
                          env=env, timeout=60)


def carry(part: Path, tmp: Path) -> None:
    """One device call: the part lands in the checkout's .gpukit/parts."""
    (tmp / "kit" / "parts" / part.name).write_bytes(part.read_bytes())


def test_parts_arrive_one_call_at_a_time_then_assemble(tmp_path: Path) -> None:
    files = {"wheels/a.whl": os.urandom(2500), "sglang.tar.xz": os.urandom(1700)}
    parts = make_kit(tmp_path / "kit", files)
    assert len(parts) >= 5
    for i, part in enumerate(parts):
        carry(part, tmp_path)
        done = stage(tmp_path, "recv")
        assert f"{part.name}: ok" in done.stdout, done.stdout + done.stderr
        held = f"held {i + 1}/{len(parts)}"
        assert held in done.stdout
        if i + 1 < len(parts):
            assert done.returncode == 3 and f"missing {parts[i + 1].name}" in done.stdout
        else:
            assert done.returncode == 0 and "complete" in done.stdout
    out = tmp_path / "payload"
    done = stage(tmp_path, "assemble", str(out))
    assert done.returncode == 0, done.stdout
    for name, data in files.items():
        assert (out / name).read_bytes() == data, name
    arrivals = (tmp_path / "gk" / "parts" / "arrivals.jsonl").read_text().splitlines()
    assert [json.loads(a)["part"] for a in arrivals] == [p.name for p in parts]
    assert "parts arrived over" in stage(tmp_path, "status").stdout


def test_a_corrupt_part_is_dropped_and_reported_missing(tmp_path: Path) -> None:
    parts = make_kit(tmp_path / "kit", {"x.bin": os.urandom(2200)})
    bad = bytearray(parts[1].read_bytes())
    bad[7] ^= 1
    (tmp_path / "kit" / "parts" / parts[1].name).write_bytes(bytes(bad))
    done = stage(tmp_path, "recv")
    assert done.returncode == 1 and "not a part of kit k1" in done.stdout
    assert f"missing {' '.join(p.name for p in parts)}" in done.stdout
    assert stage(tmp_path, "assemble").returncode == 3  # nothing assembles with parts missing


def test_a_new_kit_forgets_the_old_parts(tmp_path: Path) -> None:
    old = make_kit(tmp_path / "kit", {"x.bin": os.urandom(1500)}, kit_id="old")
    carry(old[0], tmp_path)
    assert f"held 1/{len(old)}" in stage(tmp_path, "recv").stdout
    new = make_kit(tmp_path / "kit", {"x.bin": os.urandom(1500)}, kit_id="new")
    done = stage(tmp_path, "status")
    assert done.returncode == 3 and f"kit new: held 0/{len(new)}" in done.stdout


def test_without_a_manifest_it_says_what_to_carry(tmp_path: Path) -> None:
    done = stage(tmp_path, "recv")
    assert done.returncode != 0 and "no manifest" in done.stderr


@pytest.mark.parametrize("verb", ["send", ""])
def test_unknown_verb(tmp_path: Path, verb: str) -> None:
    make_kit(tmp_path / "kit", {"x.bin": b"1"})
    done = stage(tmp_path, *([verb] if verb else []))
    assert (done.returncode, "usage" in done.stderr) == ((2, True) if verb else (3, False))


def test_an_assembled_payload_is_checked_against_the_manifest(tmp_path: Path) -> None:
    """Parts that pass their checksums but assemble to other contents (a manifest from another
    build) fail the assembly, naming the file."""
    parts = make_kit(tmp_path / "kit", {"a.whl": os.urandom(900)})
    manifest = json.loads((tmp_path / "kit" / "kit.json").read_text())
    manifest["contents"]["a.whl"] = 901
    (tmp_path / "kit" / "kit.json").write_text(json.dumps(manifest))
    for part in parts:
        carry(part, tmp_path)
    assert stage(tmp_path, "recv").returncode == 0
    done = stage(tmp_path, "assemble", str(tmp_path / "payload"))
    assert done.returncode == 1 and "lacks a.whl (901 bytes)" in done.stdout, done.stdout
