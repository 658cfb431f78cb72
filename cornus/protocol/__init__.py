"""Sans-I/O protocol core: Cornus, 2PC and coordinator-log as pure state machines.

Every machine takes events (`events.py`) and returns effects (`effects.py`); it never performs I/O,
reads a clock or draws from the global random generator. A runtime (or the simulator in
`cornus.sim`) executes the effects and feeds results back as events.
"""

from cornus.protocol.config import Protocol, ProtocolConfig
from cornus.protocol.hosts import CoordinatorHost, PartitionHost

__all__ = ["CoordinatorHost", "PartitionHost", "Protocol", "ProtocolConfig"]
