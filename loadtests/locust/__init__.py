"""Locust files, one per workload over the REST API, and the gRPC users (grpc_users.py)."""
