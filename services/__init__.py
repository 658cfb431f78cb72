"""Front ends and composition: the node-to-node gRPC transport, the public APIs, the CLI."""
