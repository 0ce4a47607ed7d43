"""The batched engine's bucket count: chosen from the state partitions when a checkpoint is
created, recorded in it, kept on restart (64 for checkpoints written before), changed only by the
rescale (export -> initial state)."""

from __future__ import annotations

from collections import Counter

import pytest

import sparkstate as ss
from sparkstate.engines.batched.engine import buckets_for, spark_partition_of
from sparkstate.errors import ConfigError
from sparkstate.pipelines import running_count
from tests.streams import LandingDir, StreamRun, failure

WORDS_1 = [f"w{i % 150}" for i in range(400)]
WORDS_2 = [f"w{i % 190}" for i in range(0, 500, 3)]


def _counts(run: StreamRun) -> dict[str, int]:
    latest: dict[str, int] = {}
    for r in run.rows:
        latest[r.word] = max(latest.get(r.word, 0), r["count"])
    return latest


def _run(spark, land: LandingDir, ck, words, *, engine=None, checkpoint=True, initial=None, already=0):
    out = running_count(land.stream(spark, "word string"), key="word", engine=engine,
                           checkpoint=ck if checkpoint else None, initial_state=initial)
    land.add([{"word": w} for w in words])
    return StreamRun(spark, out, ck, landing=land, already_read=already)


@pytest.fixture
def partitions(spark):
    def set_(n: int) -> None:
        spark.conf.set("spark.sql.shuffle.partitions", str(n))
    yield set_
    set_(2)


def test_bucket_count_covers_every_partition_as_spark_places_them(spark):
    from pyspark.sql import functions as F

    got = spark.range(-20, 30).select("id", F.pmod(F.hash(F.col("id").cast("int")), F.lit(7)).alias("p")).collect()
    assert all(spark_partition_of(r.id, 7) == r.p for r in got)  # Spark's own placement
    for n in (1, 2, 6, 200):
        b = buckets_for(n)
        assert b >= 4 * n and len({spark_partition_of(i, n) for i in range(b)}) == n


def test_new_checkpoint_follows_its_partitions_and_restarts_with_its_own_count(spark, tmp_path, partitions):
    partitions(3)
    land = LandingDir(tmp_path / "in")
    with _run(spark, land, tmp_path / "ck", WORDS_1) as run:
        run.wait_input()
    st = ss.state.stats(spark, tmp_path / "ck")
    assert st.layout_settings == {"buckets": 12} and len(st.partitions) == 3
    assert all(p.keys > 0 for p in st.partitions)  # every partition's task did stateful work

    partitions(2)  # the session changed; the checkpoint keeps its 3 partitions and 12 buckets
    with _run(spark, land, tmp_path / "ck", WORDS_2, already=len(WORDS_1)) as run:
        run.wait_input()
        assert _counts(run) == {w: n for w, n in Counter(WORDS_1 + WORDS_2).items() if w in set(WORDS_2)}
    assert ss.state.stats(spark, tmp_path / "ck").layout_settings == {"buckets": 12}


def test_a_64_bucket_checkpoint_keeps_64_and_rescales_by_export(spark, tmp_path, partitions):
    land = LandingDir(tmp_path / "in")
    ck = tmp_path / "ck"
    with _run(spark, land, ck, WORDS_1, engine=ss.BatchedEngine(buckets=64)) as run:  # as before this release
        run.wait_input()

    with pytest.raises(ConfigError, match=r"hashed into 64 buckets.*BatchedEngine\(buckets=8\).*export"):
        running_count(land.stream(spark, "word string"), key="word", engine=ss.BatchedEngine(buckets=8),
                         checkpoint=ck)
    # without checkpoint= the count cannot be read: the first batch refuses, naming the way out
    with _run(spark, land, ck, [], checkpoint=False, already=len(WORDS_1)) as run:
        land.add([{"word": w} for w in WORDS_2])
        assert "hashed into 64 buckets and the query into 8" in failure(run)

    with _run(spark, land, ck, [], already=len(WORDS_1)) as run:  # checkpoint=: goes on with 64
        run.wait_input()
        assert _counts(run) == {w: n for w, n in Counter(WORDS_1 + WORDS_2).items() if w in set(WORDS_2)}
    assert ss.state.stats(spark, ck).layout_settings == {"buckets": 64}

    # the rescale: export, then a new checkpoint at 3 partitions starts from it
    assert ss.state.export(spark, ck, tmp_path / "state.parquet") == 177
    partitions(3)
    land_b = LandingDir(tmp_path / "in_b")
    initial = spark.read.parquet(str(tmp_path / "state.parquet"))
    with _run(spark, land_b, tmp_path / "ck_b", WORDS_1, initial=initial) as run:
        run.wait_input()
        assert _counts(run) == {w: n for w, n in Counter(WORDS_1 * 2 + WORDS_2).items() if w in set(WORDS_1)}
    st = ss.state.stats(spark, tmp_path / "ck_b")
    assert st.layout_settings == {"buckets": 12} and st.keys == 177 and all(p.keys > 0 for p in st.partitions)
