"""Front ends and composition: the node-to-node transport, the public APIs, the CLI."""
