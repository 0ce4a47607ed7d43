"""Where the Kafka connector's coordinates come from, and how a job puts jars on Spark's classpath."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparkstate.cli import build_parser
from sparkstate.cli._run import _connector_settings, job_config
from sparkstate.errors import ConfigError
from sparkstate.io import connectors


def test_the_connector_comes_from_the_one_table_of_supported_versions():
    assert connectors.kafka_coordinates("4.1.4") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"
    assert connectors.kafka_coordinates("4.2.1") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    # pyspark 4.3 has no connector of its own on Maven Central: 4.2.0, which the Kafka tests run on
    assert connectors.kafka_coordinates("4.3.0") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert connectors.groups()["spark-kafka"] == [connectors.kafka_coordinates()]
    # Spark 3.5's jars are built for Scala 2.12: its connector is the _2.12 one
    assert connectors.kafka_coordinates("3.5.9") == "org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.7"
    assert connectors.kafka_coordinates("4.0.5") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"
    assert sorted(connectors.PYSPARK_VERSIONS) == ["3.5", "4.0", "4.1", "4.2", "4.3"]
    assert sorted(connectors.MATRIX_PYSPARK) == ["3.5", "4.0", "4.1", "4.2"]


def test_the_documented_command_runs_without_a_warning(tmp_path):
    """`python -m sparkstate.io.connectors` (README, install.md) runs its code once: Python warned
    when the module it ran was one `sparkstate.io` had already imported."""
    done = subprocess.run([sys.executable, "-m", "sparkstate.io.connectors", "coordinates"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[0] == f"spark-kafka: {connectors.kafka_coordinates()}"
    usage = subprocess.run([sys.executable, "-m", "sparkstate.io.connectors"], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: python -m sparkstate.io.connectors fetch")


def test_the_missing_connector_error_says_which_connector_goes_with_4_3():
    msg = str(connectors.kafka_missing("4.3.0", "kafka:h:9092/t"))
    assert "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0" in msg
    assert "no Kafka connector for Spark 4.3.0; the 4.2.0 one works with it" in msg
    assert "no Kafka connector" not in str(connectors.kafka_missing("4.2.1", "kafka:h:9092/t"))


def test_pyproject_accepts_exactly_the_supported_minors():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    bounds = set(re.findall(r'"pyspark(?:\[connect\])?>=([\d.]+),<([\d.]+)"', text))
    minors = sorted(connectors.PYSPARK_VERSIONS, key=lambda m: tuple(map(int, m.split("."))))
    major, last = map(int, minors[-1].split("."))
    assert bounds == {(minors[0], f"{major}.{last + 1}")}


def test_missing_jars_name_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKSTATE_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="make kafka"):
        connectors.jars("spark-kafka")
    assert not connectors.fetched("kafka-broker")
    assert connectors.spark_settings(kafka=True) == {}
    (tmp_path / "spark-kafka.classpath").write_text("# something else\n/x.jar\n")
    assert not connectors.fetched("spark-kafka")  # stale: other coordinates


def test_fetched_jars_leave_out_what_pyspark_ships():
    jars = connectors.jars("spark-kafka")  # make kafka ran (make test does it first)
    names = " ".join(jars)
    assert connectors.kafka_coordinates().split(":")[1] in names and "kafka-clients" in names
    assert "hadoop-client" not in names and "scala-library" not in names
    if connectors.delta_coordinates():  # PySpark 3.5: delta-spark, fetched with the Kafka groups
        delta = " ".join(connectors.jars("delta-spark"))
        assert "delta-spark_2.12-3.3.2.jar" in delta and "scala-library" not in delta


def test_run_packages_and_jars_flags(tmp_path):
    args = build_parser().parse_args(["run", "running-count", "--source", "kafka:h:9092/t", "--packages", "g:a:1",
                                      "--jars", "/a.jar"])
    cfg = job_config(args, env={})
    assert (cfg.packages, cfg.jars) == ("g:a:1", "/a.jar")
    assert _connector_settings(cfg) == {"spark.jars.packages": "g:a:1", "spark.jars": "/a.jar"}
    plain = job_config(build_parser().parse_args(["run", "running-count", "--source", "files:in"]), env={})
    assert _connector_settings(plain) == {}
    from_env = job_config(build_parser().parse_args(["run", "running-count", "--source", "kafka:h:9092/t"]),
                          env={"SPARKSTATE_PACKAGES": "g:b:2"})
    assert _connector_settings(from_env) == {"spark.jars.packages": "g:b:2"}
