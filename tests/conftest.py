"""One local SparkSession for the whole run, and helpers to drive streams deterministically."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# tests/connect runs in a pytest process of its own (a Spark Connect client turns the whole process
# to Connect): tests/test_connect.py starts it.
collect_ignore = [] if os.environ.get("SPARKSTATE_CONNECT_TESTS") else ["connect"]
# The suite's Spark JVMs (every session, and every child job, Connect server and cluster JVM that
# inherits this) compile with C1 only: its jobs are short and the machine is CPU-bound, and C2's
# compiler threads are a third of a short job's CPU (a 9-batch `sparkstate run sessionize`: 106-115
# CPU-seconds with them, 68-72 without, on two cores). What the JVM computes is the same; speed is
# measured by benchmarks/ run on their own, never here.
TEST_JIT = "-XX:TieredStopAtLevel=1"
if TEST_JIT not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), TEST_JIT]))
# Their temporary files too (Spark's local directories, the native libraries Spark's compression
# codecs unpack) go to one directory the run deletes at its end: a JVM the tests kill on purpose
# leaves them behind, and on a machine that runs the suite again and again /tmp filled up.
if "-Djava.io.tmpdir=" not in os.environ["SPARK_SUBMIT_OPTS"]:
    _JVM_TMP = tempfile.mkdtemp(prefix="sparkstate-tests-jvm-")
    os.environ["SPARK_SUBMIT_OPTS"] += f" -Djava.io.tmpdir={_JVM_TMP}"
    atexit.register(shutil.rmtree, _JVM_TMP, ignore_errors=True)
# No PYTHONPATH for the workers: state functions and dataclasses defined in test modules reach
# them the way a user's do (sparkstate ships modules that are not installed by value).


# The longest tests (child jobs killed and restarted, a standalone cluster, soaks, the benchmark
# smoke run) go first, split between the two halves of the list: `make test`'s pytest-xdist
# "worksteal" scheduler gives each of its two workers one half and lets an idle worker take the
# END of the other's queue, so each worker starts on its share of the long tests and the short
# ones fill in beside them, instead of a long tail at the end. Without xdist it is only an order;
# it is the same in every worker, as xdist requires.
LONG_FIRST = ("reliability", "slow")
LONG_IDS = ("benchmarks/test_smoke.py::test_quick_run", "tests/test_shipping.py::test_state_function_from_a_pytest",
            "tests/test_connect.py::")


def pytest_collection_modifyitems(config, items):
    def is_long(item) -> bool:
        return any(item.get_closest_marker(m) for m in LONG_FIRST) or item.nodeid.startswith(LONG_IDS)

    longs = [i for i in items if is_long(i)]
    shorts = [i for i in items if not is_long(i)]
    first, second = longs[0::2], longs[1::2]
    cut = max(0, len(items) // 2 - len(first))
    items[:] = first + shorts[:cut] + second + shorts[cut:]


@pytest.fixture(scope="session")
def spark():
    import sparkstate as ss
    from sparkstate.io import connectors

    config = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
    # Spark's Kafka connector, from the jars `make kafka` fetched (the kafka tests fail without them).
    # S3A (hadoop-aws and the AWS SDK), from the jars `make s3` fetched, for the s3a:// tests; on
    # PySpark 3.5 delta-spark, from the jars `make kafka` fetched there, for the delta: sink.
    config.update(connectors.spark_settings(kafka=True, s3a=True, delta=True))
    session = ss.spark_session("sparkstate-tests", master="local[2]", config=config)
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


@pytest.fixture(scope="session")
def kafka_broker():
    """A real single-node Kafka broker (KRaft) on a free localhost port, once per test session.

    Started from the jars ``make kafka`` fetched (``make test`` does it first); without them the
    tests that use it fail, naming the command.
    """
    from sparkstate.errors import ConfigError
    from sparkstate.io import kafka_broker as kb

    try:
        broker = kb.start()
    except ConfigError as exc:
        pytest.fail(f"no Kafka broker for the tests: {exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def kafka_spark(spark):
    """The tests' SparkSession, checked to have Spark's Kafka connector."""
    from sparkstate.io.connectors import MAKE_HINT, kafka_connector_available

    if not kafka_connector_available(spark):
        pytest.fail(f"Spark's Kafka connector is not on the test session's classpath: {MAKE_HINT}", pytrace=False)
    return spark


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
