"""Summarize a py-spy raw (collapsed-stack) profile: the functions with the most samples, by own
time (the frame on top of the stack) and by inclusive time (anywhere on the stack).

    py-spy record -p PID -d 10 -f raw -o node.raw --nonblocking
    python scripts/profile_top.py node.raw --top 25
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

# py-spy names a frame "function (file:line)"; the line makes every call site distinct, and the
# summary is about functions, so it is dropped.
_LINE = re.compile(r":\d+\)$")


def _frame(name: str) -> str:
    return _LINE.sub(")", name.strip())


def summarize(path: str, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as handle:
        for line in handle:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(count_text)
            frames = [_frame(frame) for frame in stack.split(";") if frame]
            total += count
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    lines = [f"{total} samples (py-spy leaves idle threads out unless recorded with --idle)"]
    for title, counter in (("own", own), ("inclusive", inclusive)):
        lines.append(f"-- top {top} by {title} samples")
        for frame, count in counter.most_common(top):
            lines.append(f"{100 * count / max(total, 1):5.1f}%  {frame}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summarize(args.raw, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
