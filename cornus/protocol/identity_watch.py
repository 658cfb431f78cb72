"""What a parked process does: one that another process of its node deposed (it took the node's
identity after this one did) acts no more, and watches the identity record, in case that other
process is gone.

Which process of a node takes its identity last is a race: a pod's old container restarting
while its replacement starts both take it, and the older one can win. The loser parks rather
than exits, since an exit would be restarted by a kubelet cut off from the API server and take
the identity back, round and round. But when the winner then goes away too (its pod deleted),
a parked loser would be the node's only process, parked for good. So the holder renews the record
every identity_check_ms (hosts.CoordinatorHost), and a parked process that sees the record
unchanged for identity_vacant_ms takes it for vacant: the runtime exits, and its restart takes
the identity anew. Pure: the runtime reads the record and tells the watch what it read, when.
"""

from __future__ import annotations

from cornus.protocol.config import ProtocolConfig
from cornus.protocol.events import StorageUnreachable

# What a read of the identity record found: its (epoch, version), None if there is no record,
# or that storage could not be reached.
Observed = tuple[int, int] | StorageUnreachable | None
_UNKNOWN = StorageUnreachable("no read has landed since the last that did not")


class VacancyWatch:
    """Says, read by read, whether the identity record has been vacant long enough to take."""

    def __init__(self, config: ProtocolConfig, now_ms: int) -> None:
        self.vacant_ms = config.identity_vacant_ms
        # The record as last read, and the latest moment storage can have served the read that
        # first found it so (its answer's arrival): it has been unchanged at least from then. The
        # wait starts at the first read that lands.
        self._seen: Observed = _UNKNOWN
        self._seen_since_ms = now_ms

    def observed(self, sent_ms: int, answered_ms: int, record: Observed) -> bool:
        """A read sent at `sent_ms` answered at `answered_ms` that it found `record`: True if the
        holder is gone. An unchanged record counts up to the read's sending, the earliest moment
        storage can have served it (found by review: counting to the answer's arrival took up to
        a deadline more than the record was seen unchanged)."""
        assert sent_ms <= answered_ms, (sent_ms, answered_ms)
        if isinstance(record, StorageUnreachable):
            # Unknown, not unchanged: the holder may not have reached storage either, and renews
            # within a tick of it coming back. The wait starts again at the next read that lands.
            self._seen = _UNKNOWN
            return False
        if record != self._seen:
            self._seen, self._seen_since_ms = record, answered_ms
            return False
        return sent_ms - self._seen_since_ms >= self.vacant_ms
