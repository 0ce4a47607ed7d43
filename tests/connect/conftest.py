"""The Connect tests: a real Spark Connect server for the whole run, and a client session on it.

PySpark switches a whole process to Spark Connect once a remote session is made, so these tests
run in a pytest process of their own: tests/test_connect.py runs them (``make test`` does), or
``SPARKSTATE_CONNECT_TESTS=1 pytest tests/connect``.
"""

from __future__ import annotations

import pytest

from tests.connect import server as connect_server


@pytest.fixture(scope="session")
def connect_server_proc():
    """The server (tests/connect/server.py), to inject faults into."""
    try:
        srv = connect_server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield srv
    finally:
        srv.remove()


@pytest.fixture(scope="session")
def connect_url(connect_server_proc):
    return connect_server_proc.url


@pytest.fixture(scope="session")
def spark(connect_url):
    import sparkstate as ss

    session = ss.spark_session("sparkstate-connect-tests", remote=connect_url)
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()
