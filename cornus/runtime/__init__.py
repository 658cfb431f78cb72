"""The node runtime: executes the protocol core's effects against real storage and peers."""
