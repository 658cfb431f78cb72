"""Cornus: atomic commit middleware over disaggregated storage (protocol core, runtime and CLI)."""

__version__ = "0.1.0"
