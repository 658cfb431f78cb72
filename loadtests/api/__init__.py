"""How every driver talks to a node, whatever its transport, so the built-in driver
(loadtests.bench) and the Locust users (loadtests.locust, REST and gRPC) cannot drift apart:
`exchange` runs a transaction program as calls (begin, requests, abort), `replies` turns a node's
answer into the Reply a program receives, `rest` names the REST call of each step, and `load` is
the load phase. Nothing here imports redis or boto3 (Locust's gevent patching must come first)."""
