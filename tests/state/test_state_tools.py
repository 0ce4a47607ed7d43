"""Offline state tools on real checkpoints: read, export -> initial_state, evolution checks."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import sparkstate as ss
from sparkstate.engines import BatchedEngine
from tests.conftest import checkpoint_encoding
from tests.streams import LandingDir, StreamRun


@dataclass
class Visits:
    user: str
    pages: list[str] = field(default_factory=list)


def track(user, rows, state):
    v = state.getOption or Visits(user)
    v.pages = v.pages + [r.page for r in rows]
    state.update(v)
    state.setTimeoutDuration("1 hour")
    return (user, ",".join(v.pages))


def visits_query(spark, land, **kw):
    return ss.map_groups_with_state(land.stream(spark, "user string, page string"), key="user", func=track,
                                    state_type=Visits, output_type="user string, pages string",
                                    timeout=ss.GroupStateTimeout.ProcessingTimeTimeout, **kw)


BATCHES = [
    [("u1", "a"), ("u2", "b")],
    [("u1", "c")],
    [("u2", "d"), ("u3", "e")],
    [("u1", "f")],
]


def feed(run, land, batches):
    for b in batches:
        land.add([{"user": u, "page": p} for u, p in b])
        run.wait_input()


def test_read_decodes_state_and_pending_timeouts(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"user": "u1", "page": "a"}, {"user": "u1", "page": "b"}, {"user": "u2", "page": "c"}])
    with StreamRun(spark, visits_query(spark, land), tmp_path / "ck", landing=land) as run:
        run.wait_input()
    df = ss.state.read(spark, tmp_path / "ck")
    assert df.columns == ["user", "pages", "timeout_ms"]
    rows = {r.user: r for r in df.collect()}
    assert {u: r.pages for u, r in rows.items()} == {"u1": ["a", "b"], "u2": ["c"]}
    assert all(r.timeout_ms > 1_700_000_000_000 for r in rows.values())  # an hour after the batch


def test_export_then_new_source_and_partitions_equals_one_uninterrupted_query(spark, tmp_path):
    # The reference: one query over all four batches.
    ref_land = LandingDir(tmp_path / "ref_in")
    ref_land.add([])
    with StreamRun(spark, visits_query(spark, ref_land), tmp_path / "ref_ck", landing=ref_land) as run:
        feed(run, ref_land, BATCHES)
        reference = [tuple(r) for r in run.rows]

    # First half on source A, then export.
    land_a = LandingDir(tmp_path / "in_a")
    land_a.add([])
    with StreamRun(spark, visits_query(spark, land_a), tmp_path / "ck_a", landing=land_a) as run:
        feed(run, land_a, BATCHES[:2])
        first = [tuple(r) for r in run.rows]
    assert ss.state.export(spark, tmp_path / "ck_a", tmp_path / "state.parquet") == 2

    # Second half: another source directory, another partition count, state from the export.
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        land_b = LandingDir(tmp_path / "in_b")
        land_b.add([])
        initial = spark.read.parquet(str(tmp_path / "state.parquet"))
        with StreamRun(spark, visits_query(spark, land_b, initial_state=initial), tmp_path / "ck_b",
                       landing=land_b) as run:
            feed(run, land_b, BATCHES[2:])
            second = [tuple(r) for r in run.rows]
        assert ss.state.stats(spark, tmp_path / "ck_b").operator["partitions"] == 3
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert sorted(first + second) == sorted(reference)
    assert ("u1", "a,c,f") in second and ("u2", "b,d") in second


def test_stats_counts_keys_per_partition_and_batch(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([])
    with StreamRun(spark, visits_query(spark, land, engine="tws"), tmp_path / "ck", landing=land) as run:
        feed(run, land, BATCHES[:3])
    st = ss.state.stats(spark, tmp_path / "ck", last_batches=1000)
    assert st.keys == 3 and st.keys_with_timeout == 3
    assert sum(p.keys for p in st.partitions) == 3 and len(st.partitions) == 2
    assert st.bytes_on_disk > 0 and all(p.bytes_on_disk > 0 for p in st.partitions)
    assert st.operator["time_mode"] == "ProcessingTime" and "sparkstate_v2" in st.operator["state_variables"]
    assert set(st.keys_per_batch.values()) == {0, 2, 3}  # empty first file, then 2 keys, then 3


# --- evolution --------------------------------------------------------------------------

@dataclass
class V1:
    n: int
    label: str


@dataclass
class V2Compatible:  # label removed, n widened, a defaulted field added
    n: float
    tags: list[str] = field(default_factory=list)


@dataclass
class V3Renamed:
    count: int


@dataclass
class V4Narrowed:
    n: int
    label: int


def count_into(cls):
    def f(user, rows, state):
        k = sum(1 for _ in rows)
        if cls is V1:
            st = state.getOption or V1(0, "x")
            st.n += k
        else:
            st = state.getOption or V2Compatible(0.0)
            st.n += k
        state.update(st)
        return (user, float(st.n))
    return f


@pytest.mark.parametrize("engine", ["tws", "batched"])
def test_compatible_changes_keep_state_and_incompatible_ones_fail_before_start(spark, tmp_path, engine,
                                                                               state_encoding):
    land = LandingDir(tmp_path / "in")
    ck = tmp_path / "ck"

    def define(cls, func=None, key="user", **kw):
        src = land.stream(spark, "user string, page string")
        if key != "user":
            src = src.withColumnRenamed("user", key)
        # batched: one bucket, one key per leaf, so a batch touches some leaves of a bucket only
        eng = BatchedEngine(buckets=1, leaf_rows=1) if engine == "batched" else engine
        return ss.map_groups_with_state(src, key=key, func=func or count_into(cls), state_type=cls,
                                        output_type="user string, n double", checkpoint=ck, engine=eng, **kw)

    land.add([{"user": "u1", "page": "a"}, {"user": "u1", "page": "b"}, {"user": "u2", "page": "a"}])
    with StreamRun(spark, define(V1), ck, landing=land) as run:
        run.wait_input()
    assert checkpoint_encoding(ck) == state_encoding

    with pytest.raises(ss.StateSchemaError) as renamed:
        define(V3Renamed)
    msg = str(renamed.value)
    assert "count: added without a default (bigint)" in msg
    assert "n: removed (bigint)" in msg and "label: removed (string)" in msg
    assert "sparkstate state export" in msg and "initial_state=" in msg

    with pytest.raises(ss.StateSchemaError, match=r"label: type changed \(string -> bigint\)"):
        define(V4Narrowed)
    with pytest.raises(ss.StateSchemaError, match=r"key user: removed \(string\)"):
        define(V1, key="user_id")

    land.add([{"user": "u1", "page": "c"}])
    with StreamRun(spark, define(V2Compatible), ck, landing=land, already_read=3) as run:
        run.wait_input()
        assert [tuple(r) for r in run.rows] == [("u1", 3.0)]
    # u1 was rewritten under V2Compatible, u2 was not: the tools show both in the new shape
    state = {r.user: r for r in ss.state.read(spark, ck).collect()}
    assert {u: (r.n, r.tags) for u, r in state.items()} == {"u1": (3.0, []), "u2": (1.0, None)}
    if engine == "tws":  # u2's row still holds V1, so a later change is checked against both types
        with pytest.raises(ss.StateSchemaError, match=r"label: type changed \(string -> bigint\)"):
            define(V4Narrowed)
    land.add([{"user": "u2", "page": "b"}])
    land.add([{"user": "u1", "page": "d"}])
    with StreamRun(spark, define(V2Compatible), ck, landing=land, already_read=4) as run:
        run.wait_input()
        assert sorted(tuple(r) for r in run.rows) == [("u1", 4.0), ("u2", 2.0)]


def test_checkpoint_of_another_query_is_refused(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"user": "u1", "page": "a"}])
    counts = land.stream(spark, "user string, page string").groupBy("user").count()
    # (the session's defaults take Spark's own aggregations, next to sparkstate's operators)
    with StreamRun(spark, counts, tmp_path / "ck", landing=land) as run:
        run.wait_input()
    # (Spark 3.5 records no operator names: the operator is named by its id there)
    with pytest.raises(ss.StateSchemaError,
                       match=r"does not hold sparkstate state: it has (stateStoreSave|a stateful operator \(id 0\))"):
        ss.state.read(spark, tmp_path / "ck")
    with pytest.raises(ss.StateSchemaError, match="does not hold sparkstate state"):
        visits_query(spark, land, checkpoint=tmp_path / "ck")
