"""Deterministic simulator for the protocol core: seeded schedules of message delay, loss and
reordering, node crashes and restarts, and storage outages, with invariant checks after every run."""
