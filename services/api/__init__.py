"""Public front ends of a node: the REST API (and, later, the public gRPC API)."""
