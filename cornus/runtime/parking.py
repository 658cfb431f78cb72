"""What a deposed process does once it stops acting: another process of its node took the node's
identity after this one (a pod replaced while its process lived on, or two taking it at once), so
this one decides, writes and serves nothing more (cornus.runtime.node cuts it off), but does not
exit while that process lives. A pod force-deleted on a kubelet cut off from the API server is
restarted by that kubelet when its process exits, and the restarted process's take would depose
the replacement in turn, and so on (found by review). It parks, alive and not ready, and watches
the identity record (cornus.protocol.identity_watch): once the other process renews it no more
(the older of two that took it at once won, then went away: found by the simulator), it sets
`vacant`, and serve exits with EXIT_CODE_IDENTITY_VACANT for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from cornus.protocol.config import ProtocolConfig
from cornus.runtime import identity
from cornus.runtime.effect_runner import crash_if_failed
from storage_adapters.store import LogStore

log = logging.getLogger("cornus.node")

# The exit status of a parked process that found its node's identity vacant: EX_TEMPFAIL, "try
# again", which is what its supervisor does (a restart takes the identity anew).
EXIT_CODE_IDENTITY_VACANT = 75


class Parking:
    """One node's parking: `park` once deposed, `stop` when the process stops."""

    def __init__(self, node_id: str, store: LogStore, config: ProtocolConfig) -> None:
        self._node_id = node_id
        self._store = store
        self._config = config
        self.vacant = asyncio.Event()
        self._halting: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def parked(self) -> bool:
        return self._halting is not None

    def park(self, halt: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `halt` (what stops the node's parts, writing and releasing nothing), then watch."""
        assert self._halting is None, "parked twice"
        # A task of its own: the runner's stop, which `halt` awaits, cancels the runner's tasks.
        self._halting = asyncio.get_running_loop().create_task(self._park(halt), name="cornus-park")
        # An error ends the process: parked for ever, it would leave its node with no live
        # process once the other goes (found by audit, 2026-11-28: the watch died unobserved).
        self._halting.add_done_callback(crash_if_failed)

    async def _park(self, halt: Callable[[], Coroutine[Any, Any, None]]) -> None:
        await halt()
        if not self._stopping:  # a stop under way ends the process anyway (found by review)
            self._watching = asyncio.get_running_loop().create_task(self._watch(), name="cornus-watch")
            self._watching.add_done_callback(crash_if_failed)

    async def _watch(self) -> None:
        await identity.watch_until_vacant(self._store, self._node_id, self._config)
        log.error("node %s: the process that took its identity renews it no more; this one exits, to be "
                  "restarted", self._node_id)
        self.vacant.set()

    def stopping(self) -> None:
        """The process is stopping: a park from now on watches nothing."""
        self._stopping = True

    async def stop(self) -> None:
        """Wait for the halt, if parked, and end the watch."""
        if self._halting is not None:
            await self._halting
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
