"""Chaos harness for Cornus: real `cornus serve` nodes whose node->node and node->storage links
run through Toxiproxy, a seeded schedule of network and process faults, a bank and a register
workload, then safety and liveness checks over what the clients saw and what storage holds.

Run it as `python -m loadtests.chaos --help`; loadtests/chaos/README.md explains the output.
"""
