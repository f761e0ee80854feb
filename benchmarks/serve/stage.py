"""The receiving end of the kit's parts on the GPU machine (stdlib only: it runs before any
carried package is installed).

    python3 benchmarks/serve/stage.py recv     # take the carried .gpukit/parts/part-NN, check it
    python3 benchmarks/serve/stage.py status   # which parts are held, which are missing
    python3 benchmarks/serve/stage.py assemble # all parts -> the payload folder (exit 1 if any
                                               # is missing)

A device call carries `.gpukit/kit.json` (the manifest `build_kit.sh` wrote: each part's size and
sha256) and one part. `recv` checks the part against the manifest and moves it to GK/parts
(default /tmp/gk: it stays while the machine is warm), logs when it arrived, and prints what is
held and what is missing, so the caller knows which part to send next; on a fresh machine
nothing is held and the count restarts. A manifest of another kit clears the parts held.
Exit status: 0 when every part is held, 3 while parts are missing, 1 on a bad part.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

KIT = Path(os.environ.get("KIT", ".gpukit"))
GK = Path(os.environ.get("GK", "/tmp/gk"))
MISSING = 3


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest() -> dict:
    held = GK / "kit.json"
    carried = KIT / "kit.json"
    if carried.is_file():
        new = json.loads(carried.read_text())
        if held.is_file() and json.loads(held.read_text())["kit"] != new["kit"]:
            shutil.rmtree(GK / "parts", ignore_errors=True)  # another kit: start over
        (GK / "parts").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(carried, held)
        return new
    if held.is_file():
        return json.loads(held.read_text())
    sys.exit(f"[stage] no manifest: carry {carried} (benchmarks/serve/build_kit.sh writes it)")


def held_parts(kit: dict) -> tuple[list[str], list[str]]:
    have = {p.name for p in (GK / "parts").glob("part-*")}
    names = [p["name"] for p in kit["parts"]]
    return [n for n in names if n in have], [n for n in names if n not in have]


def arrivals() -> list[dict]:
    log = GK / "parts" / "arrivals.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def status_line(kit: dict) -> str:
    held, missing = held_parts(kit)
    line = f"[stage] kit {kit['kit']}: held {len(held)}/{len(kit['parts'])}"
    return line + (f"; missing {' '.join(missing)}" if missing else "; complete")


def recv() -> int:
    kit = manifest()
    by_name = {p["name"]: p for p in kit["parts"]}
    bad = 0
    for path in sorted((KIT / "parts").glob("part-*")):
        want = by_name.get(path.name)
        t0 = time.time()
        if want is None or path.stat().st_size != want["bytes"] or sha256(path) != want["sha256"]:
            print(f"[stage] {path.name}: not a part of kit {kit['kit']} (size or sha256 "
                  "differs): dropped")
            path.unlink()
            bad = 1
            continue
        before = arrivals()
        shutil.move(str(path), GK / "parts" / path.name)
        now = time.time()
        gap = f"+{now - before[-1]['t']:.1f} s after {before[-1]['part']}" if before else "first"
        with open(GK / "parts" / "arrivals.jsonl", "a") as log:
            log.write(json.dumps({"part": path.name, "t": now, "bytes": want["bytes"]}) + "\n")
        print(f"[stage] {path.name}: ok, {want['bytes'] / 2**20:.1f} MiB, sha256 checked in "
              f"{now - t0:.2f} s, {gap}")
    print(status_line(kit))
    _, missing = held_parts(kit)
    return bad or (MISSING if missing else 0)


def status() -> int:
    kit = manifest()
    print(status_line(kit))
    seen = arrivals()
    if len(seen) > 1:
        span = seen[-1]["t"] - seen[0]["t"]
        print(f"[stage] {len(seen)} parts arrived over {span:.0f} s "
              f"({span / (len(seen) - 1):.1f} s a call)")
    return MISSING if held_parts(kit)[1] else 0


def assemble(dest: Path) -> int:
    kit = manifest()
    held, missing = held_parts(kit)
    if missing:
        print(status_line(kit))
        return MISSING
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cat = subprocess.Popen(["cat", *[str(GK / "parts" / n) for n in held]], stdout=subprocess.PIPE)
    rc = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=cat.stdout).returncode
    rc |= cat.wait()
    for name, size in kit["contents"].items():
        if not (dest / name).is_file() or (dest / name).stat().st_size != size:
            print(f"[stage] assembled payload lacks {name} ({size} bytes)")
            rc = 1
    print(f"[stage] assembled {kit['payload_bytes'] / 2**20:.0f} MiB into {dest} in "
          f"{time.time() - t0:.1f} s: {'ok' if rc == 0 else 'FAILED'}")
    return 1 if rc else 0


def main(argv: list[str]) -> int:
    verb = argv[0] if argv else "status"
    if verb == "recv":
        return recv()
    if verb == "status":
        return status()
    if verb == "assemble":
        return assemble(Path(argv[1]) if len(argv) > 1 else GK / "payload")
    print(f"usage: stage.py recv|status|assemble [DEST] (got {verb!r})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
