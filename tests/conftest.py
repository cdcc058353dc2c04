"""Fixtures shared by test modules."""

from hub_server import hub  # noqa: F401  (a loopback server speaking the Hub's HTTP API)
