"""The generated code is built from node.proto on demand, rebuilt when stale, and safe to build
from several processes at once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from services.node_rpc import codegen
from tests.node_rpc.conftest import REPO

# Two processes racing must both finish well within this.
BUILD_TIMEOUT_S = 120


def _proto_copy(tmp_path: Path) -> Path:
    # Same relative layout as the repository: the descriptor name depends on it.
    proto = tmp_path / "services" / "node_rpc" / "node.proto"
    proto.parent.mkdir(parents=True)
    shutil.copy(codegen.PROTO_PATH, proto)
    return proto


def test_builds_then_stays_fresh_then_rebuilds_when_the_proto_changes(tmp_path: Path) -> None:
    proto = _proto_copy(tmp_path)
    output = tmp_path / "out" / "_generated"
    assert codegen.ensure_generated(output, proto)
    assert codegen.is_fresh(output, proto)
    assert not codegen.ensure_generated(output, proto)
    services_module = (output / "node_pb2_grpc.py").read_text()
    assert services_module.startswith("# ruff: noqa")
    assert "from . import node_pb2 as" in services_module
    assert not list(output.parent.glob(".*build-*")), "staging folder left behind"

    proto.write_text(proto.read_text() + "\nmessage Extra { string field = 1; }\n")
    assert not codegen.is_fresh(output, proto)
    assert codegen.ensure_generated(output, proto)
    assert "Extra" in (output / "node_pb2.pyi").read_text()


def test_missing_module_is_rebuilt(tmp_path: Path) -> None:
    proto = _proto_copy(tmp_path)
    output = tmp_path / "out" / "_generated"
    codegen.ensure_generated(output, proto)
    (output / "node_pb2.py").unlink()
    assert not codegen.is_fresh(output, proto)
    assert codegen.ensure_generated(output, proto)


def test_concurrent_builds_from_two_processes(tmp_path: Path) -> None:
    proto = _proto_copy(tmp_path)
    output = tmp_path / "out" / "_generated"
    script = (
        "import sys; from pathlib import Path; from services.node_rpc import codegen; "
        "print(codegen.ensure_generated(Path(sys.argv[1]), Path(sys.argv[2])))"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(output), str(proto)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    results = [process.communicate(timeout=BUILD_TIMEOUT_S)[0].strip() for process in processes]
    assert all(process.returncode == 0 for process in processes)
    assert results.count("True") == 1, results  # exactly one built; the others found it fresh
    assert codegen.is_fresh(output, proto)


def test_module_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.node_rpc.codegen"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=True,
    )
    assert result.stdout.startswith("fresh: ")
