"""Helpers shared by the test modules of every layer (tests/README.md)."""
