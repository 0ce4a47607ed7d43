"""Fixtures of the io tests: a real PostgreSQL server (see tests/io/pg.py)."""

from tests.io.pg import postgres_server  # noqa: F401  (a session-scoped fixture)
