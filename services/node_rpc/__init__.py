"""Node-to-node transport: `node.proto` (the wire format), its codec and `PeerTransport` (plain TCP).

Importing the package builds the generated protobuf code when it is missing or stale (see
`codegen`), so a fresh clone needs no separate build step.
"""

from services.node_rpc.codegen import ensure_generated

ensure_generated()
