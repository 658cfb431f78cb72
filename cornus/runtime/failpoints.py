"""Named crash points for fault-injection tests: a test arms one by environment variable and the
process dies there with kill -9 semantics (no cleanup, no flush of anything but stderr), or, with
`:stop`, pauses there as SIGSTOP would, until something sends it SIGCONT.

    CORNUS_FAILPOINTS="coordinator.after_votes"            die at the first hit
    CORNUS_FAILPOINTS="participant.after_log_vote@3,..."   die at the third hit
    CORNUS_FAILPOINTS="owner.before_fenced_write:stop"     pause at the first hit

Unarmed, a failpoint costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

from storage_adapters.errors import ValidationError

ENV_VAR = "CORNUS_FAILPOINTS"
HIT_COUNT_MAX = 1_000_000

# Every failpoint the runtime has. Arming an unknown name is an error, so a typo in a test cannot
# silently arm nothing.
KNOWN = frozenset(
    {
        "coordinator.before_prepare",  # execution done, prepare not sent
        "coordinator.after_prepare",  # prepare sent, no vote seen yet
        "coordinator.after_votes",  # every vote in, outcome not yet replied or logged
        "coordinator.after_decision_log",  # 2PC/coordinator-log: decision durable, not yet sent
        "coordinator.after_reply",  # outcome replied to the caller, decisions not yet sent
        "participant.before_log_vote",  # prepare received, vote not yet logged
        "participant.after_log_vote",  # vote durable, not yet sent
        "participant.before_apply",  # decision known, redo not yet applied
        "participant.after_apply",  # redo applied, locks not yet released
        "owner.before_fenced_write",  # a partition owner's write has its fence, not yet sent
    }
)
STOP = "stop"


def parse(raw: str) -> tuple[dict[str, int], set[str]]:
    """`name[@N][:stop],...` -> ({name: N}, names that stop rather than kill); ValidationError for
    unknown names, bad counts or actions."""
    armed: dict[str, int] = {}
    stopping: set[str] = set()
    for item in filter(None, (part.strip() for part in raw.split(","))):
        spec, _, action = item.partition(":")
        if action not in ("", STOP):
            raise ValidationError(f"failpoint {item!r}: the action after ':' can only be {STOP!r}")
        name, _, count = spec.partition("@")
        if name not in KNOWN:
            raise ValidationError(f"unknown failpoint {name!r}; known: {', '.join(sorted(KNOWN))}")
        if count and (not count.isdigit() or not 0 < int(count) <= HIT_COUNT_MAX):
            raise ValidationError(f"failpoint {item!r}: the hit count must be in 1..{HIT_COUNT_MAX}")
        armed[name] = int(count or 1)
        if action:
            stopping.add(name)
    return armed, stopping


class Failpoints:
    def __init__(self, armed: Mapping[str, int], stopping: set[str] | None = None) -> None:
        assert all(name in KNOWN for name in armed)
        self._remaining = dict(armed)
        self._stopping = stopping or set()
        assert self._stopping <= set(armed)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Failpoints:
        environ = os.environ if environ is None else environ
        return cls(*parse(environ.get(ENV_VAR, "")))

    def armed(self, name: str) -> bool:
        return name in self._remaining

    def hit(self, name: str) -> None:
        assert name in KNOWN, f"failpoint {name!r} is not in KNOWN"
        if name not in self._remaining:
            return
        self._remaining[name] -= 1
        if self._remaining[name] > 0:
            return
        if name in self._stopping:
            del self._remaining[name]
            sys.stderr.write(f"cornus: failpoint {name} hit, pausing process {os.getpid()} until SIGCONT\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        sys.stderr.write(f"cornus: failpoint {name} hit, killing process {os.getpid()}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
