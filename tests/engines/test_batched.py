"""What is particular to the batched engine: values equal to the Row API's, one bucket shared by
many keys (shared timers, leaf splits), bounded rewrites, state tools, engine mismatch."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.engines import BatchedEngine
from sparkstate.engines.batched.layout import DIR_VARIABLE, LEAF_VARIABLE, Directory, leaf_bits, leaf_of, split_leaf
from tests.engines.test_engines import EXPECTED, run_on_harness, run_on_spark
from tests.streams import LandingDir, StreamRun

# --- pure layout ----------------------------------------------------------------------------


def test_split_leaf_partitions_the_hash_space_and_bounds_leaf_size():
    entries = {f"k{i}": [(i,), None, (i * 0x9E3779B97F4A7C15) & ((1 << 63) - 1)] for i in range(1000)}
    leaves = split_leaf(1, dict(entries), 16)
    assert sum(len(v) for v in leaves.values()) == 1000
    assert max(len(v) for v in leaves.values()) <= 16
    index = {lid: [len(v), None] for lid, v in leaves.items()}
    # every key is found in the leaf that holds it, through the directory walk
    for k, e in entries.items():
        assert k in leaves[leaf_of(index, leaf_bits(e[2]))]


def test_keys_with_identical_hash_bits_stay_in_one_leaf():
    same = {f"k{i}": [(i,), None, 7 << 32] for i in range(40)}
    leaves = split_leaf(1, same, 8)
    assert sorted(len(v) for v in leaves.values() if v) == [40]


# --- packed input: the mapInArrow step and the processor's grouping ---------------------------

def _grouper(names: list[str], key_pos: list[int]):
    """The batched engine's input grouping alone (no Spark, no state)."""
    from types import SimpleNamespace

    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from sparkstate.engines.batched.grouping import Grouper
    from sparkstate.engines.batched.layout import HASH_COLUMN

    schema = StructType([StructField(n, StringType() if n != "n" else LongType()) for n in names]
                        + [StructField(HASH_COLUMN, LongType())])
    plan = SimpleNamespace(key_columns=[names[i] for i in key_pos], value_decoder=None)
    return Grouper(plan, schema)


def _packed_frames(rows: list[tuple], hashes: list[int], buckets: list[int]):
    import pandas as pd
    import pyarrow as pa

    from sparkstate.engines.batched.packing import packer
    from sparkstate.engines.batched.layout import BUCKET_COLUMN, HASH_COLUMN

    table = pa.table({"user": [r[0] for r in rows], "n": pa.array([r[1] for r in rows], pa.int64()),
                      HASH_COLUMN: pa.array(hashes, pa.int64()), BUCKET_COLUMN: pa.array(buckets, pa.int32())})
    out = list(packer(3)(iter(table.to_batches(max_chunksize=3))))
    frames = {}
    for batch in out:
        for b, blob in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            frames.setdefault(b, []).append(blob)
    return {b: pd.DataFrame({"bucket": [b] * len(v), "blob": v}) for b, v in frames.items()}


def test_packing_keeps_every_row_and_each_keys_order():
    rows = [("a", 1), ("b", 2), ("a", 3), (None, 4), ("c", 2**62 + 1), ("b", None), ("a", 5), (None, 6)]
    hashes = [11, 22, 11, 42, 33, 22, 11, 42]
    frames = _packed_frames(rows, hashes, [h % 2 for h in hashes])
    assert sorted(frames) == [0, 1]
    got = {}
    for frame in frames.values():
        groups, hs = _grouper(["user", "n"], [0]).group(iter([frame]))
        for k, vals in groups.items():
            got[k] = ([tuple(v) for v in vals], hs[k])
    assert got == {
        "a": ([("a", 1), ("a", 3), ("a", 5)], 11),
        "b": ([("b", 2), ("b", None)], 22),
        "c": ([("c", 2**62 + 1)], 33),
        None: ([(None, 4), (None, 6)], 42),  # a null key is a key like any other
    }


def test_two_keys_with_one_hash_are_kept_apart():
    rows = [("x", 1), ("y", 2), ("x", 3), ("y", 4)]
    frame = _packed_frames(rows, [7, 7, 7, 7], [0, 0, 0, 0])[0]
    groups, hs = _grouper(["user", "n"], [0]).group(iter([frame]))
    assert {k: [v.n for v in vals] for k, vals in groups.items()} == {"x": [1, 3], "y": [2, 4]}
    assert hs == {"x": 7, "y": 7}


# --- values reach the function as under the Row API -----------------------------------------

ROWS = [
    (1, None, 2**62 + 1, 1.5, "x", True, datetime(2024, 1, 2, 3, 4, 5, 600000), "2024-05-06", "12.34",
     b"ab", [1, None, 3], {"a": 1}, ("in", 2)),
    (1, 7, None, None, None, None, None, None, None, None, None, None, None),
    (2, 8, -5, float("nan"), "", False, datetime(1999, 12, 31, 23, 59, 59), "1970-01-01", "0.01",
     b"", [], {}, ("z", None)),
]
SCHEMA = ("k int, i int, l long, d double, s string, b boolean, t timestamp, dt string, dec string, bin binary,"
          " arr array<int>, m map<string,int>, st struct<name:string,n:int>")


def _seen(key, rows, state):
    return [(key, repr(tuple(r))) for r in rows]


def test_values_are_the_row_api_values(spark):
    df = (spark.createDataFrame(ROWS, SCHEMA)
          .withColumn("dt", F.to_date("dt")).withColumn("dec", F.col("dec").cast("decimal(10,2)")))
    seen = {}
    for engine in ("tws", "batched"):
        out = ss.flat_map_groups_with_state(df, key="k", func=_seen, state_type=int,
                                            output_type="k int, seen string", engine=engine)
        # the Row API's UTC is zoneinfo's, ours datetime's: equal, but printed differently
        seen[engine] = sorted((r.k, r.seen.replace("zoneinfo.ZoneInfo(key='UTC')", "datetime.timezone.utc"))
                              for r in out.collect())
    assert seen["batched"] == seen["tws"]
    got = [s for _, s in seen["batched"]]
    assert len(got) == 3
    full = next(s for s in got if "'x'" in s)
    assert str(2**62 + 1) in full  # a long beyond 2**53 arrives exact
    assert "datetime.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=datetime.timezone.utc)" in full
    assert "Row(name='in', n=2)" in full and "{'a': 1}" in full and "[1, None, 3]" in full
    assert "Decimal('12.34')" in full and "datetime.date(2024, 5, 6)" in full and "b'ab'" in full
    assert "(1, 7, None, None, None, None, None, None, None, None, None, None, None)" in got
    assert "(2, 8, -5, nan, ''" in next(s for s in got if s.startswith("(2,"))  # NaN stays NaN, not null


OUT_TYPE = ("k int, i int, l long, sh short, by byte, d double, f float, s string, b boolean, bin binary,"
            " t timestamp, arr array<int>, st struct<name:string,n:int>")
OUT_ROWS = {
    1: (1, -2**31, 2**62 + 1, -2**15, 127, 1.5, 0.25, "x", True, b"ab", datetime(2024, 1, 2, 3, 4, 5, 600000),
        [1, None, 3], ("in", 2)),
    2: (2, None, None, None, None, None, None, None, None, None, None, None, None),
    3: (3, 2**31 - 1, -5, 0, -128, float("nan"), float("-inf"), "", False, b"", datetime(1999, 12, 31, 23, 59, 59),
        [], ("z", None)),
}


def _emit(key, rows, state):
    return OUT_ROWS[key]


def test_outputs_are_the_same_values_under_both_engines(spark):
    """Each flat output type goes out as an Arrow-backed column on the batched engine: the values
    Spark gets (NaN apart from null, longs past 2**53, the ends of each integer range) are the
    tws engine's."""
    df = spark.createDataFrame([(k,) for k in OUT_ROWS], "k int")
    got = {}
    for engine in ("tws", "batched"):
        out = ss.map_groups_with_state(df, key="k", func=_emit, state_type=int, output_type=OUT_TYPE, engine=engine)
        got[engine] = sorted(repr(tuple(r)) for r in out.collect())
    assert got["batched"] == got["tws"]
    assert "nan" in got["batched"][2] and "-inf" in got["batched"][2]  # NaN stays NaN, not null
    assert str(2**62 + 1) in got["batched"][0] and str(-2**31) in got["batched"][0]
    assert got["batched"][1] == repr((2,) + (None,) * 12)


def test_an_output_out_of_its_types_range_is_refused_in_words(spark):
    df = spark.createDataFrame([(1,)], "k int")
    out = ss.map_groups_with_state(df, key="k", func=lambda k, rows, state: (k, 2**31), state_type=int,
                                   output_type="k int, n int", engine="batched")
    with pytest.raises(Exception, match=r"an output for key 1 does not match output_type: output.n: 2147483648 does"
                                        r" not fit in int \(-2147483648 to 2147483647\)"):
        out.collect()


def test_unpacked_input_gives_the_same_results(spark):
    df = spark.createDataFrame([(f"u{i % 7}", i) for i in range(60)] + [(None, 1)], "user string, n long")
    got = {}
    for pack in (True, False):
        out = ss.map_groups_with_state(df, key="user", func=_count, state_type=int, output_type="user string, n long",
                                       engine=BatchedEngine(buckets=3, pack=pack))
        got[pack] = sorted(out.collect(), key=lambda r: (r.user is None, r.user or ""))
    assert got[True] == got[False]
    assert [tuple(r) for r in got[False]] == [(f"u{i}", 9 if i < 4 else 8) for i in range(7)] + [(None, 1)]


# --- late rows: Spark's own rule on both engines -------------------------------------------

def _seen_times(key, rows, state):
    return [(key, r.t.isoformat()) for r in rows]


def test_late_rows_are_dropped_by_sparks_rule_on_both_engines(spark, tmp_path):
    """An event-time input reaches the batched engine unpacked, so Spark still drops the rows
    behind the previous batch's watermark, exactly as under the tws engine."""
    got = {}
    for engine in ("tws", "batched"):
        land = LandingDir(tmp_path / engine / "in")
        events = land.stream(spark, "k string, t timestamp").withWatermark("t", "10 seconds")
        out = ss.flat_map_groups_with_state(events, key="k", func=_seen_times, state_type=int,
                                            output_type="k string, seen string", engine=engine,
                                            timeout=ss.GroupStateTimeout.EventTimeTimeout)
        with StreamRun(spark, out, tmp_path / engine / "ck", landing=land) as run:
            land.add([{"k": "a", "t": "2024-01-01T00:01:00Z"}])
            run.wait_input()
            land.add([{"k": "b", "t": "2024-01-01T00:02:00Z"}])  # the watermark moves to 00:01:50
            run.wait_input()
            land.add([{"k": "a", "t": "2024-01-01T00:00:30Z"},  # behind it: dropped by Spark
                      {"k": "c", "t": "2024-01-01T00:01:55Z"}])
            run.wait_input()
            land.add([{"k": "d", "t": "2024-01-01T00:03:00Z"}])
            run.wait_input()
            dropped = sum(o["numRowsDroppedByWatermark"] for p in run.query.recentProgress
                          for o in p["stateOperators"])
        got[engine] = (sorted(tuple(r) for r in run.rows), dropped)
    assert got["batched"] == got["tws"]
    rows, dropped = got["batched"]
    assert dropped == 1 and not any(seen.startswith("2024-01-01T00:00:30") for _, seen in rows)
    assert [k for k, _ in rows] == ["a", "b", "c", "d"]


# --- one bucket for every key: shared timer, leaf splits --------------------------------------

@pytest.mark.parametrize("keep", [False, True], ids=["expire", "keep_expired"])
def test_scripted_scenario_with_all_keys_in_one_bucket_and_tiny_leaves(spark, tmp_path, keep):
    got = run_on_spark(spark, tmp_path, keep, BatchedEngine(buckets=1, leaf_rows=1))
    assert sorted(got) == sorted(EXPECTED[keep]) == sorted(run_on_harness(keep))


def _count(key, rows, state):
    n = (state.getOption or 0) + sum(1 for _ in rows)
    state.update(n)
    return (key, n)


def _leaves(spark, ck) -> list[dict]:
    blobs = spark.read.format("statestore").option("stateVarName", LEAF_VARIABLE).load(str(ck)).collect()
    return [pickle.loads(r.user_map_value.blob) for r in blobs]


def test_a_batch_rewrites_only_the_leaves_it_touches(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"user": f"u{i:04d}"} for i in range(2000)])
    engine = BatchedEngine(buckets=2, leaf_rows=16)
    out = ss.map_groups_with_state(land.stream(spark, "user string"), key="user", func=_count, state_type=int,
                                   output_type="user string, n long", engine=engine)
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        # the first sparse batch on a leaf may split it (layout.split_rows), the next one cannot
        land.add([{"user": "u0001"}, {"user": "u0002"}, {"user": "u0001"}])
        run.wait_input()
        land.add([{"user": "u0001"}, {"user": "u0002"}])
        run.wait_input()
        progress = [p for p in run.query.recentProgress if p["numInputRows"] == 2][-1]
        rows = sorted(tuple(r) for r in run.rows)
    assert ("u0001", 4) in rows and ("u0002", 3) in rows and len(rows) == 2004
    dirs = spark.read.format("statestore").option("stateVarName", DIR_VARIABLE).load(str(tmp_path / "ck")).collect()
    leaves = sum(len(Directory.loads(r.value.blob).leaves) for r in dirs)
    assert leaves >= 2000 // 16  # the 2000 keys were split over many small leaves
    updated = progress["stateOperators"][0]["numRowsUpdated"]
    # two keys touched: only their leaves are rewritten; the directories are not, as no leaf's
    # key count or earliest timeout changed
    assert 1 <= updated <= 2, progress["stateOperators"][0]
    # a count is a small state: its leaves stay whole (layout.seal_leaf), one pickle each
    assert {type(e[0]) for leaf in _leaves(spark, tmp_path / "ck") for e in leaf.values()} == {tuple}
    assert {Directory.loads(r.value.blob).version for r in dirs} == {2}
    state = ss.state.read(spark, tmp_path / "ck")
    assert state.count() == 2000
    assert state.where("user = 'u0001'").first().value == 4 and state.where("user = 'u0002'").first().value == 3


def test_a_sparse_batch_splits_the_leaves_it_writes_to_half_size_and_counts_stay_exact(spark, tmp_path):
    """layout.split_rows: a leaf written by a call that ran fewer than half of its keys splits past
    half of leaf_rows (32 of 64), one that most of its keys had input for past leaf_rows; leaves the
    batch did not touch stay as they are, and every count stays exact."""
    land = LandingDir(tmp_path / "in")
    users = [f"u{i:04d}" for i in range(1500)]
    land.add([{"user": u} for u in users])
    ck = tmp_path / "ck"
    out = ss.map_groups_with_state(land.stream(spark, "user string"), key="user", func=_count, state_type=int,
                                   output_type="user string, n long", engine=BatchedEngine(buckets=2))
    touched = set(users[::10])
    with StreamRun(spark, out, ck, landing=land) as run:
        run.wait_input()
    before = _leaves(spark, ck)
    with StreamRun(spark, out, ck, landing=land, already_read=1500) as run:
        land.add([{"user": u} for u in sorted(touched)])
        run.wait_input()
        rows = sorted(tuple(r) for r in run.rows if r.user in touched and r.n == 2)
    # the first batch ran every key of its leaves: they split past 64, so some hold more than 32
    assert max(map(len, before)) > 32 and sum(map(len, before)) == 1500
    after = _leaves(spark, ck)
    untouched = [leaf for leaf in before if not touched & leaf.keys()]
    assert untouched and all(leaf in after for leaf in untouched)  # leaves without input stay as they were
    written = [leaf for leaf in after if leaf not in untouched]  # the touched leaves, split
    assert max(map(len, written)) <= 32 and sum(map(len, after)) == 1500
    assert len(after) > len(before)
    assert rows == sorted((u, 2) for u in touched)
    state = {r.user: r.value for r in ss.state.read(spark, ck).collect()}
    assert state == {u: 2 if u in touched else 1 for u in users}


@dataclass
class Trail:
    pages: list[str]


def _trail(user, rows, state):
    t = state.getOption or Trail([])
    t.pages += [r.page for r in rows]
    state.update(t)
    return (user, len(t.pages), t.pages[-1])


def test_a_batch_that_touches_few_keys_seals_their_leaves_and_state_reads_back_exact(spark, tmp_path):
    """Layout version 2 through Spark: a leaf whose keys a batch ran with input for few of is
    written sealed (each key's state a pickle of its own), the others stay whole; the state tools
    and a restarted query read both."""
    land = LandingDir(tmp_path / "in")
    start = "/start/" + "s" * 60  # a state larger than SEAL_MIN_KEY_BYTES a key
    land.add([{"user": f"u{i:04d}", "page": f"{start}/{i}"} for i in range(1000)])

    def query():
        return ss.map_groups_with_state(land.stream(spark, "user string, page string"), key="user", func=_trail,
                                        state_type=Trail, output_type="user string, n long, last string",
                                        engine=BatchedEngine(buckets=2, leaf_rows=16))

    with StreamRun(spark, query(), tmp_path / "ck", landing=land) as run:
        run.wait_input()
        land.add([{"user": "u0001", "page": "/second"}, {"user": "u0002", "page": "/second"}])
        run.wait_input()
    leaves = _leaves(spark, tmp_path / "ck")
    forms = {k: type(e[0]) for leaf in leaves for k, e in leaf.items()}
    assert forms["u0001"] is bytes and forms["u0002"] is bytes
    # the leaves the batch wrote (u0001's and u0002's, and the other halves of any leaf it split:
    # layout.split_rows) are sealed whole; the rest stay as the first batch wrote them
    sealed = [leaf for leaf in leaves if any(type(e[0]) is bytes for e in leaf.values())]
    assert all(type(e[0]) is bytes for leaf in sealed for e in leaf.values())
    assert any("u0001" in leaf for leaf in sealed) and any("u0002" in leaf for leaf in sealed)
    assert list(forms.values()).count(tuple) == 1000 - sum(len(leaf) for leaf in sealed) > 900
    state = ss.state.read(spark, tmp_path / "ck").toPandas().set_index("user")
    assert len(state) == 1000 and list(state.loc["u0001", "pages"]) == [f"{start}/1", "/second"]
    assert list(state.loc["u0500", "pages"]) == [f"{start}/500"]
    # a restarted query opens a sealed key and a whole one
    neighbour = next(k for leaf in sealed for k in leaf if k not in ("u0001", "u0002"))
    land.add([{"user": "u0001", "page": "/third"}, {"user": neighbour, "page": "/again"},
              {"user": "u0500", "page": "/again"}])
    with StreamRun(spark, query(), tmp_path / "ck", landing=land) as run:
        run.wait_input(3)
        rows = sorted(tuple(r) for r in run.rows)
    assert rows == sorted([("u0001", 3, "/third"), (neighbour, 2, "/again"), ("u0500", 2, "/again")])


# --- state tools and engine mismatch ----------------------------------------------------------

@dataclass
class Visits:
    n: int
    last: str


def _visits(user, rows, state):
    rows = list(rows)
    v = state.getOption or Visits(0, "")
    v.n += len(rows)
    v.last = rows[-1].page
    state.update(v)
    state.setTimeoutDuration("1 hour")
    return (user, v.n)


def test_state_tools_read_export_and_resume_from_a_batched_checkpoint(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"user": f"u{i}", "page": f"p{i}"} for i in range(300)] + [{"user": "u1", "page": "again"}])

    def query(src, ck_engine, initial=None):
        return ss.map_groups_with_state(src, key="user", func=_visits, state_type=Visits,
                                        output_type="user string, n long", engine=ck_engine,
                                        timeout=ss.GroupStateTimeout.ProcessingTimeTimeout, initial_state=initial)

    with StreamRun(spark, query(land.stream(spark, "user string, page string"), "batched"), tmp_path / "ck",
                   landing=land, trigger="300 milliseconds") as run:
        run.wait_input()
    assert ss.state.engine_of(spark, tmp_path / "ck") == "batched"
    state = ss.state.read(spark, tmp_path / "ck")
    assert state.columns == ["user", "n", "last", "timeout_ms"]
    u1 = state.where("user = 'u1'").first()
    assert (u1.n, u1.last) == (2, "again") and u1.timeout_ms > datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp() * 1000
    stats = ss.state.stats(spark, tmp_path / "ck")
    assert stats.keys == 300 and stats.keys_with_timeout == 300
    assert ss.state.export(spark, tmp_path / "ck", tmp_path / "export") == 300

    # the export starts a query on the other engine, on a new checkpoint
    land2 = LandingDir(tmp_path / "in2")
    land2.add([{"user": "u1", "page": "p"}, {"user": "new", "page": "p"}])
    initial = spark.read.parquet(str(tmp_path / "export"))
    with StreamRun(spark, query(land2.stream(spark, "user string, page string"), "tws", initial), tmp_path / "ck2",
                   landing=land2, trigger="300 milliseconds") as run:
        run.wait_input()
        assert sorted(tuple(r) for r in run.rows) == [("new", 1), ("u1", 3)]

    # and a query on the wrong engine is refused before it starts
    with pytest.raises(ss.StateSchemaError, match="written by the 'batched' engine and this query runs on the 'tws'"):
        ss.map_groups_with_state(land.stream(spark, "user string, page string"), key="user", func=_visits,
                                 state_type=Visits, output_type="user string, n long", engine="tws",
                                 checkpoint=tmp_path / "ck")

    # without engine=: the engine that wrote the checkpoint; else the default, or tws for state_ttl
    def bucketed(**kw):
        df = ss.map_groups_with_state(land.stream(spark, "user string, page string"), key="user", func=_visits,
                                      state_type=Visits, output_type="user string, n long",
                                      timeout=ss.GroupStateTimeout.ProcessingTimeTimeout, **kw)
        return "_sparkstate_bucket" in df._jdf.queryExecution().analyzed().toString()

    assert bucketed(checkpoint=tmp_path / "ck") and not bucketed(checkpoint=tmp_path / "ck2")
    assert bucketed() and not bucketed(state_ttl="1 hour")


def test_state_ttl_is_refused_with_a_way_out(spark):
    df = spark.createDataFrame([("a",)], "user string")
    with pytest.raises(ss.ConfigError, match="state_ttl is not supported by the batched engine.*engine='tws'"):
        ss.map_groups_with_state(df, key="user", func=_count, state_type=int, output_type="user string, n long",
                                 state_ttl="1 hour", engine="batched")


def test_leaf_blobs_are_plain_pickles_of_builtin_values(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"user": "a"}, {"user": "b"}])
    out = ss.map_groups_with_state(land.stream(spark, "user string"), key="user", func=_count, state_type=int,
                                   output_type="user string, n long", engine="batched")
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
    leaves = spark.read.format("statestore").option("stateVarName", LEAF_VARIABLE).load(str(tmp_path / "ck"))
    entries = {}
    for r in leaves.collect():
        entries.update(pickle.loads(r.user_map_value.blob))
    assert {k: (v[0], v[1]) for k, v in entries.items()} == {"a": ((1,), None), "b": ((1,), None)}


def test_leaf_placement_of_many_keys_matches_leaf_of():
    import numpy as np

    from sparkstate.engines.batched.layout import build_leaves, leaf_bits, leaf_of, place_keys

    rng = np.random.default_rng(5)
    hashes = rng.integers(-2**63, 2**63 - 1, 3000, dtype=np.int64).tolist()
    leaves = {lid: [len(e), None] for lid, e in build_leaves({i: [None, None, h] for i, h in enumerate(hashes)},
                                                              16).items()}
    assert len({int(lid).bit_length() for lid in leaves}) > 1  # leaves at several depths
    probe = hashes[:500] + rng.integers(-2**63, 2**63 - 1, 500, dtype=np.int64).tolist()
    assert place_keys(leaves, probe) == [leaf_of(leaves, leaf_bits(h)) for h in probe]
