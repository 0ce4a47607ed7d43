"""The version matrix: a core subset of the suite on each supported PySpark minor other than the
main one (sparkstate.io.connectors.PYSPARK_VERSIONS), each in a virtualenv of its own under the
cache dir (tests/versions/venvs.py), as a pytest subprocess. The subset, chosen by measured
durations: an operator restarted on the same checkpoint (tws engine), event-time sessionize on
shuffled input equal to the reference and restarted mid-stream (batched engine), the state tools
reading a checkpoint,
the batched engine's request windows against that release's own state client, and a Kafka round
trip through that release's own Kafka connector (resolved with Maven, as `make kafka` does)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparkstate.io import connectors

from . import venvs

# Operators with a restart: sessionize (flat_map_groups_with_state) restarts mid-stream; the state read
# test runs map_groups_with_state; the Kafka round trip uses that release's own connector.
SUBSET = [
    "tests/pipelines/test_sessionize_order.py::test_shuffled_streams_on_spark_equal_the_reference_and_restart_mid_stream[batched]",
    "tests/state/test_state_tools.py::test_read_decodes_state_and_pending_timeouts",
    "tests/engines/test_batched_wire.py",
    "tests/io/test_kafka.py::test_kafka_sink_round_trip_equals_the_parquet_sink",
    "tests/versions/test_matrix.py::test_this_release_is_the_one_the_matrix_asked_for",
]


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=venvs.ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("minor", sorted(connectors.MATRIX_PYSPARK))
def test_core_subset_on_each_supported_minor(minor):
    version = connectors.MATRIX_PYSPARK[minor]
    py = venvs.ensure(version)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYSPARK_", "SPARK_"))}
    env.pop("VIRTUAL_ENV", None)
    # That release's own Kafka connector, resolved with Maven into ~/.m2 like `make kafka`; its
    # classpath lists live beside the venv so the main suite's lists stay as they are.
    env["SPARKSTATE_CACHE"] = str(venvs.venv_dir(version) / "cache")
    env["SPARKSTATE_MATRIX_EXPECT"] = version
    fetch = _run([str(py), "-m", "sparkstate.io.connectors", "fetch"], env, 600)
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    res = _run([str(py), "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "--durations=0",
                "-o", "addopts=", *SUBSET], env, 900)
    if res.returncode != 0:
        sys.stdout.write(res.stdout[-20000:] + res.stderr[-5000:])
    assert res.returncode == 0, f"the core subset failed on pyspark {version} (output above)"
    assert " passed" in res.stdout and "skipped" not in res.stdout, res.stdout[-3000:]


def test_this_release_is_the_one_the_matrix_asked_for():
    """In the main suite: pyspark is the main minor's tested release, and its Kafka connector is
    the table's choice (4.3 -> the 4.2.0 connector, the newest on Maven Central); in a matrix
    venv: that release and its own minor's connector."""
    import pyspark

    want = os.environ.get("SPARKSTATE_MATRIX_EXPECT") or connectors.PYSPARK_VERSIONS[connectors.MAIN_MINOR][0]
    assert pyspark.__version__ == want
    minor = ".".join(want.split(".")[:2])
    assert connectors.kafka_coordinates() == f"{connectors.SPARK_KAFKA}:{connectors.PYSPARK_VERSIONS[minor][1]}"
    if minor == "4.3":
        assert connectors.kafka_coordinates() == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert connectors.jars("spark-kafka")  # fetched for this release (`make kafka`, or the matrix)
