"""The protocol core is pure (DESIGN: it imports neither asyncio nor grpc nor a storage client),
so the simulator explores it deterministically and the runtime decides nothing. Checked in a
fresh interpreter: what importing the core and the simulator loads, transitively."""

from __future__ import annotations

import subprocess
import sys

IMPORT_TIMEOUT_S = 60.0
# Modules whose presence would mean I/O or a clock reached the core.
FORBIDDEN = ("asyncio", "grpc", "redis", "sqlite3", "azure", "aiobotocore", "botocore", "uvloop")


def test_core_and_simulator_load_no_io_module() -> None:
    program = (
        "import sys, pkgutil, importlib, cornus.protocol, cornus.sim\n"
        "for package in (cornus.protocol, cornus.sim):\n"
        "    for info in pkgutil.iter_modules(package.__path__):\n"
        "        importlib.import_module(f'{package.__name__}.{info.name}')\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=IMPORT_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"the pure core loads I/O modules: {done.stdout.strip()}"
