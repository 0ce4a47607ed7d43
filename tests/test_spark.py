"""ss.spark_session() fills in only what nobody set: spark-submit's settings stand, a running
session is reused as it is (with one warning naming what differs), local-only defaults stay local."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import pyspark

import sparkstate as ss
from sparkstate.spark import ROCKSDB_PROVIDER

from tests.conftest import ROOT


def test_spark_submit_settings_stand_and_the_state_takes_their_partitions(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text("".join(f'{{"word": "w{i % 7}"}}\n' for i in range(50)))
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import json
        import sparkstate as ss
        spark = ss.spark_session()
        words = spark.readStream.schema("word string").json({str(tmp_path / 'in')!r})
        counts = ss.pipelines.running_count(words, key="word")
        q = (counts.writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", {str(tmp_path / 'ck')!r}).start())
        q.processAllAvailable(); q.stop()
        st = ss.state.stats(spark, {str(tmp_path / 'ck')!r})
        conf = spark.conf
        print(json.dumps({{"partitions": st.operator["partitions"], "keys": st.keys,
                          "shuffle": conf.get("spark.sql.shuffle.partitions"),
                          "tz": conf.get("spark.sql.session.timeZone"),
                          "provider": conf.get("spark.sql.streaming.stateStore.providerClass"),
                          "memory": conf.get("spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB"),
                          "block": conf.get("spark.sql.streaming.stateStore.rocksdb.blockSizeKB"),
                          "codegen": conf.get("spark.sql.codegen.hugeMethodLimit")}}))
        spark.stop()
    """))
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run(
        [str(submit), "--master", "local[2]", "--conf", "spark.sql.shuffle.partitions=12",
         "--conf", "spark.sql.session.timeZone=America/New_York",
         "--conf", "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB=96",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.bindAddress=127.0.0.1", str(script)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"partitions": 12, "keys": 7, "shuffle": "12", "tz": "America/New_York",
                   "provider": ROCKSDB_PROVIDER, "memory": "96", "block": "16",
                   "codegen": "8000"}  # theirs stand; the rest is filled


def test_a_running_session_is_reused_as_it_is_with_one_warning(spark):
    key = "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB"
    before = spark.conf.get(key)
    spark.conf.set(key, "32")
    try:
        with pytest.warns(UserWarning, match=rf"reuses the running session as it is, which has {key}=32"
                                             r" \(sparkstate's default 64: the budget"):
            again = ss.spark_session()
        assert again is spark and spark.conf.get(key) == "32"
        # an explicit config= still applies
        assert ss.spark_session(config={key: "48"}).conf.get(key) == "48"
    finally:
        spark.conf.set(key, before)


def test_python_workers_talk_over_unix_sockets_where_spark_has_them(spark, tmp_path):
    from sparkstate.versions import PYTHON_UNIX_SOCKETS, has

    conf = spark.sparkContext.getConf()
    if has(PYTHON_UNIX_SOCKETS):
        assert conf.get("spark.python.unix.domain.socket.enabled") == "true"
    else:  # 3.5 and 4.0 have no such setting: nothing is set
        assert conf.get("spark.python.unix.domain.socket.enabled") is None

    # A Python stage and a Python stateful operator run over them, pids and all.
    def pids(batches):
        import pyarrow as pa

        for b in batches:
            yield pa.RecordBatch.from_pydict({"id": b.column(0), "pid": [os.getpid()] * b.num_rows})

    rows = spark.range(0, 40, 1, 4).mapInArrow(pids, "id long, pid long").collect()
    assert sorted(r.id for r in rows) == list(range(40)) and all(r.pid != os.getpid() for r in rows)
    counts = ss.pipelines.running_count(spark.createDataFrame([("a",), ("b",), ("a",)], "word string"))
    assert sorted((r.word, r["count"]) for r in counts.collect()) == [("a", 2), ("b", 1)]
