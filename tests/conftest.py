"""One local SparkSession for the whole run, and helpers to drive streams deterministically."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# No PYTHONPATH for the workers: state functions and dataclasses defined in test modules reach
# them the way a user's do (sparkstate ships modules that are not installed by value).


@pytest.fixture(scope="session")
def spark():
    import sparkstate as ss

    session = ss.spark_session(
        "sparkstate-tests",
        master="local[2]",
        config={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    from tests import streams

    if streams._listener is not None:
        session.streams.removeListener(streams._listener)
    for q in session.streams.active:
        q.stop()
    session.stop()


@pytest.fixture(autouse=True, scope="session")
def _doctest_spark(doctest_namespace):
    doctest_namespace["ROOT"] = ROOT
