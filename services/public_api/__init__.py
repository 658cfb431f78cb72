"""The public gRPC API (`cornus.public.v1.Cornus`, `public.proto`), with the standard health and
reflection services beside it.

Importing the package builds the generated protobuf code when it is missing or stale, with the same
mechanism as the node-to-node protocol (`services.node_rpc.codegen`), so nothing generated is
committed and a fresh clone needs no build step.
"""

from pathlib import Path

from services.node_rpc.codegen import ensure_generated

PROTO_PATH = Path(__file__).resolve().parent / "public.proto"
# The initial metadata in which Execute, Put and Get name their transaction before it runs: a
# caller whose deadline passes while it commits asks Status about it (public.proto).
TXN_METADATA_KEY = "cornus-txn"
OUTPUT_DIR = PROTO_PATH.parent / "_generated"

ensure_generated(OUTPUT_DIR, PROTO_PATH)
