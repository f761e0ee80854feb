"""A strict one-file unified-diff applier (no fuzz, no search): the signal patch goes onto a
header whose sha256 was checked first, so every hunk must match at its stated line."""

from __future__ import annotations

import re

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_patch(original: str, patch: str) -> str:
    """`original` with the one-file unified diff `patch` applied; ValueError names the first
    hunk that does not match at its stated line."""
    lines = original.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # next unconsumed line of `lines`
    hunks = 0
    plines = patch.splitlines(keepends=True)
    i = 0
    while i < len(plines):
        match = _HUNK.match(plines[i])
        if match is None:
            i += 1
            continue
        hunks += 1
        start = int(match.group(1)) - 1 if match.group(2) != "0" else int(match.group(1))
        if start < pos:
            raise ValueError(f"patch hunk {hunks} overlaps the previous one")
        out.extend(lines[pos:start])
        pos = start
        i += 1
        while i < len(plines) and not plines[i].startswith("@@"):
            tag, body = plines[i][:1], plines[i][1:]
            if tag in (" ", "-"):
                if pos >= len(lines) or _strip_eol(lines[pos]) != _strip_eol(body):
                    raise ValueError(f"patch hunk {hunks} does not match line {pos + 1}: "
                                     f"expected {body.rstrip()!r}")
                if tag == " ":
                    out.append(lines[pos])
                pos += 1
            elif tag == "+":
                out.append(body if body.endswith("\n") else body + "\n")
            elif tag != "\\":  # "\ No newline at end of file"
                break
            i += 1
    if not hunks:
        raise ValueError("the patch has no hunk")
    out.extend(lines[pos:])
    return "".join(out)


def _strip_eol(line: str) -> str:
    return line.rstrip("\r\n")
