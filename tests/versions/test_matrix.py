"""The version matrix: a core subset of the suite on each supported PySpark minor other than the
main one (sparkstate.io.connectors.PYSPARK_VERSIONS), each in a virtualenv of its own under the
cache dir (tests/versions/venvs.py), as a pytest subprocess. The subset: :data:`SUBSET`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparkstate.engines import DEFAULT_ENGINE, default_engine, runtime
from sparkstate.io import connectors

from . import venvs

# Every operator on the minor's default engine ({engine}): map_groups_with_state (a scripted
# scenario of event-time timeouts against the harness, a restart on the same checkpoint, a static
# DataFrame), flat_map_groups_with_state (event-time sessionize on shuffled input, and late="emit"
# with sessionize's and the user's watermark), update_state_by_key (a 1 ms processing-time timeout
# every batch); what the minor lacks refused in one line; a Kafka round trip through that
# release's own Kafka connector (resolved with Maven, as `make kafka` does).
SUBSET = [
    "tests/pipelines/test_sessionize_order.py::test_another_shuffled_order_on_spark_equals_the_reference[{engine}]",
    "tests/pipelines/test_sessionize_order.py::test_a_shuffled_order_with_late_emit_equals_the_reference_and_refuses_the_late",
    "tests/engines/test_engines.py::test_harness_and_engines_agree_on_scripted_scenario[{engine}-expire]",
    "tests/engines/test_engines.py::test_restart_on_same_checkpoint_continues_state_exactly[{engine}]",
    "tests/engines/test_engines.py::test_static_dataframe_one_pass[{engine}]",
    "tests/test_seeds.py::test_seed_001_first_last_activity_update_state_by_key",
    "tests/versions/test_runtime.py",
    "tests/io/test_kafka.py::test_kafka_sink_round_trip_equals_the_parquet_sink",
    "tests/versions/test_matrix.py::test_this_release_is_the_one_the_matrix_asked_for",
    "tests/pipelines/test_sessionize_order.py::test_a_checkpoint_of_the_inband_per_key_path_goes_on_under_its_columnar_logic",
    # rows refused by a reason column (the parse's, as `sparkstate run` passes them) stay out of sessions and watermark
    "tests/pipelines/test_sessionize_order.py::test_rows_refused_by_a_reason_column_join_nothing_and_leave_the_watermark[{engine}]",
    # initial state (map_groups_with_state with pending timeouts, map_with_state with a
    # processing-time timeout), on the minor's default engine: the batched engine's
    # transformWithState initial state, the inband engine's seeds (3.5)
    "tests/engines/test_engines.py::test_initial_state_with_pending_timeouts_for_map_groups_with_state[{engine}]",
    "tests/test_seeds.py::test_seed_001_word_count_map_with_state_initial_state_and_timeout[{engine}]",
]
#: Besides, on the minors whose job runs other code than the main minor's (3.5: the inband engine,
#: Kafka output through foreachBatch, the state tools on Spark's state store on the driver; 4.0: the
#: state client's one-by-one calls): `sparkstate run sessionize` SIGKILLed mid-stream and restarted
#: equals the reference sessions, and `sparkstate state show|stats` read its checkpoint. On 4.1 and
#: 4.2 a job runs the main minor's code (the same features, the same windows of state requests), which
#: the main suite kills and restarts (tests/reliability/test_driver_crash.py); what their Spark does
#: with a checkpoint it goes on from is the restart mid-stream of WITH_TRANSFORM_WITH_STATE.
KILLED_AND_RESTARTED = [
    "tests/reliability/test_cli_kill_and_restart.py::test_sessionize_killed_and_restarted_equals_the_reference_and_the_state_tools_read_it",
]
#: Besides, on the batched engine (4.0 and later): sessionize restarted mid-stream with the state
#: tools reading the open sessions, the state tools, and the batched engine's request windows
#: against that release's own state client. On 3.5 the state tools read Spark's state store on
#: the driver (tests/versions/test_runtime.py).
WITH_TRANSFORM_WITH_STATE = [
    "tests/pipelines/test_sessionize_order.py::test_shuffled_streams_on_spark_equal_the_reference_and_restart_mid_stream[{engine}]",
    "tests/state/test_state_tools.py::test_read_decodes_state_and_pending_timeouts",
]
#: Besides, where the inband engine is the default (3.5): its initial state applied once and
#: never on a restart, with or without it (the main suite runs it on 4.3); a job's metrics of its
#: no-data batches.
WITHOUT_TRANSFORM_WITH_STATE = [
    "tests/engines/test_inband_initial_state.py",
    # Spark 3.5 reports no observed metrics for a batch without input: the job's own counts of it
    "tests/test_cli.py::test_run_sessionize_once_writes_exactly_the_reference_sessions",
    # --no-pack names the release whose engine it needs
    "tests/jobs/test_engine_choice.py::test_no_pack_alone_is_refused_only_where_the_default_engine_always_packs",
]
#: The releases whose state client the batched engine sends windows of requests to
#: (sparkstate.engines.batched.wire: 4.1 and later; 4.0 gets the public one-by-one calls).
WINDOWS = ["tests/engines/test_batched_wire.py"]
#: PySpark 4.0 only: the tws engine on transformWithStateInPandas (engines/tws/pandas_processor.py),
#: with Spark's per-key state TTL, timeouts and initial state (4.1 and later run it on Rows).
TWS_ON_PANDAS = [
    "tests/engines/test_engines.py::test_state_ttl_drops_state_not_updated_for_that_long",
    "tests/engines/test_engines.py::test_harness_and_engines_agree_on_scripted_scenario[tws-expire]",
    "tests/engines/test_engines.py::test_initial_state_with_pending_timeouts_for_map_groups_with_state[tws]",
]
#: PySpark 4.0 only, the oldest minor whose `sparkstate run` sends Kafka output and Kafka dead
#: letters from its streaming query (3.5 writes them through foreachBatch, which the Kafka round
#: trip above tests there).
STRAIGHT_TO_KAFKA = ["tests/io/test_kafka.py::test_output_and_dead_letters_to_kafka_go_out_in_one_streaming_write"]
#: Delta from the executors with delta-spark on 3.5 (fetched with the connectors), from the driver
#: with delta-rs elsewhere: the same table read back with deltalake.
SUBSET += ["tests/io/test_delta.py::test_delta_sink_writes_from_the_executors_where_delta_spark_fits"]


def subset(minor: str) -> list[str]:
    """The subset for ``minor``, on the engine a query there gets without engine=."""
    engine = default_engine(runtime.minor_of(minor))
    tests = SUBSET + (WITH_TRANSFORM_WITH_STATE if engine == DEFAULT_ENGINE else WITHOUT_TRANSFORM_WITH_STATE)
    tests += WINDOWS if runtime.minor_of(minor) >= (4, 1) else []
    tests += KILLED_AND_RESTARTED if runtime.minor_of(minor) < (4, 1) else []  # other code than the main minor's
    tests += TWS_ON_PANDAS + STRAIGHT_TO_KAFKA if runtime.minor_of(minor) == (4, 0) else []
    return [t.format(engine=engine) for t in tests]


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=venvs.ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
# A venv (made once, under the cache dir), that release's Kafka connector, then the subset: longer
# than pytest's default 600 s on a fresh, busy machine.
@pytest.mark.timeout(2400)
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
                "-o", "addopts=", *subset(minor)], env, 900)
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
    scala = connectors.SCALA_VERSIONS.get(minor, connectors.SCALA)
    assert connectors.kafka_coordinates() == f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{connectors.PYSPARK_VERSIONS[minor][1]}"
    if minor == "3.5":
        assert connectors.kafka_coordinates() == "org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.7"
    if minor == "4.3":
        assert connectors.kafka_coordinates() == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert connectors.jars("spark-kafka")  # fetched for this release (`make kafka`, or the matrix)
