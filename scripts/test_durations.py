"""Write tests/slow_tests.txt from the output of a whole run with `--durations=0`: each test that
took at least SECONDS_MIN (setup, call and teardown together), slowest first. tests/conftest.py
hands those to the xdist workers first, so that a run does not end with one worker still on a
40 s test while the others wait.

    bash scripts/test.sh --durations=0 > /tmp/run.txt 2>&1
    python3 scripts/test_durations.py /tmp/run.txt
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

SECONDS_MIN = 3.0
OUT = Path(__file__).resolve().parent.parent / "tests" / "slow_tests.txt"
# "12.34s call     tests/x.py::test_y[param]@group"
_LINE = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S.*?)(@[^\]@]*)?$")


def main(run_output: Path) -> None:
    seconds: collections.Counter[str] = collections.Counter()
    for line in run_output.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match:
            seconds[match.group(3)] += float(match.group(1))
    slow = [(s, nodeid) for nodeid, s in seconds.items() if s >= SECONDS_MIN]
    if not slow:
        sys.exit(f"no test of {SECONDS_MIN} s or more in {run_output}: was it run with --durations=0?")
    slow.sort(key=lambda pair: (-pair[0], pair[1]))
    header = "# seconds nodeid: written by scripts/test_durations.py; tests/conftest.py runs these first\n"
    OUT.write_text(header + "".join(f"{s:.1f} {nodeid}\n" for s, nodeid in slow))
    print(f"{len(slow)} tests of {SECONDS_MIN} s or more, {sum(s for s, _ in slow):.0f} s together -> {OUT}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
