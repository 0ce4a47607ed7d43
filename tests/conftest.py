"""One local SparkSession for the whole run, and helpers to drive streams deterministically."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Workers must import test modules (state dataclasses and functions defined in them).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), str(ROOT / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)


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


ENCODING_KEY = "spark.sql.streaming.stateStore.encodingFormat"


@pytest.fixture(params=["unsaferow", "avro"])
def state_encoding(request, spark):
    """Run a test's new checkpoints under each state encoding (a checkpoint keeps the one it
    started with: Spark records it in the offset log)."""
    before = spark.conf.get(ENCODING_KEY, None)
    spark.conf.set(ENCODING_KEY, request.param)
    try:
        yield request.param
    finally:
        if before is None:
            spark.conf.unset(ENCODING_KEY)
        else:
            spark.conf.set(ENCODING_KEY, before)


def checkpoint_encoding(checkpoint) -> str:
    """The state encoding a checkpoint runs with, as its first offset-log entry records it."""
    import json

    lines = (Path(checkpoint) / "offsets" / "0").read_text().splitlines()
    return json.loads(lines[1])["conf"].get(ENCODING_KEY, "unsaferow")
