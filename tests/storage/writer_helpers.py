"""What the emulator writer's tests share: watching writer processes come and go."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from storage_adapters import emulator_writer

# How long a process may take to go away after it was told to (or chose to), on a loaded 2-core
# machine; a writer that never leaves blows far past it.
EXIT_WAIT_S = emulator_writer.IDLE_MS_MAX / 1000 + 10.0
POLL_S = 0.02


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has stopped running: whether it was reaped is another test's)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read
        return False


async def wait_gone(pid: int, within_s: float = EXIT_WAIT_S) -> None:
    async with asyncio.timeout(within_s):
        while alive(pid):  # noqa: ASYNC110 - another process's exit has no event here
            await asyncio.sleep(POLL_S)


def writers_of(path: Path) -> list[int]:
    """The running writer processes of the file at `path`, found by their command line."""
    found = []
    wanted = str(Path(path).absolute()).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                args = cmdline.read().split(b"\0")
        except OSError:
            continue
        if b"storage_adapters.emulator_writer" in args and wanted in args and alive(int(entry)):
            found.append(int(entry))
    return found
