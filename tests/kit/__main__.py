"""`python -m tests.kit`: build (or find) the CPU kit and the tiny model; how to serve by hand."""

from __future__ import annotations

import sys

from tests.kit.build import KitMissing, build_kit, build_tiny_dsv3, pd_missing


def main() -> int:
    try:
        kit, model = build_kit(), build_tiny_dsv3()
    except KitMissing as exc:
        print(f"CPU kit: {exc}", file=sys.stderr)
        return 1
    print(f"kit:   {kit.path}\nmodel: {model}")
    if (reason := pd_missing()) is not None:
        print(f"note: {reason}")
    print(f"\nsource {kit.path / 'env.sh'}\nsglang serve --model-path {model} --device cpu "
          "--host 127.0.0.1 --port 30000 --attention-backend torch_native "
          "--max-total-tokens 16384 --sleep-on-idle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
