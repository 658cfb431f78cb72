"""Node-to-node transport over gRPC: `node.proto`, its codec and `GrpcTransport`.

Importing the package builds the generated protobuf code when it is missing or stale (see
`codegen`), so a fresh clone needs no separate build step.
"""

from services.node_rpc.codegen import ensure_generated

ensure_generated()
