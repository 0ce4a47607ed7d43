"""The columnar sessionizer (``SessionLogic``, run by the batched engine's ``LogicProcessor``) against
the per-key one (``BucketProcessor`` running ``Sessionizer``), without Spark: the same bucket input, batch after batch, in shuffled orders, must
give the same output rows and leave the same leaves, timer and directory behind, for every shape of
event-time sessionize (late rows dropped or emitted with their reason, carried columns, the
event-time column, ``emit_on_last``), and for a state of the single-session layout. Through Spark,
the shuffled-stream tests of test_sessionize_order.py run the columnar path (it is the batched
engine's for event time)."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.types import (ArrayType, BooleanType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from benchmarks.loop import Handle, Times, key_hashes
from sparkstate.engines.base import StatePlan
from sparkstate.engines.batched.layout import BUCKET_COLUMN, HASH_COLUMN, LEAF_VARIABLE, open_entry
from sparkstate.engines.batched.packing import packer
from sparkstate.engines.batched.logic import LogicProcessor
from sparkstate.engines.batched.processor import BucketProcessor
from sparkstate.group_state import GroupStateTimeout
from sparkstate.pipelines.columnar_sessionizer import SessionLogic
from sparkstate.pipelines.sessionizer import OpenSession, Sessionizer
from sparkstate.types import Codec, encoder_for

GAP_MS = 60_000
T0 = 1_704_067_200_000
KEYS = [f"u{i}" for i in range(12)]
HASH = dict(zip(KEYS, key_hashes(len(KEYS)).tolist()))
DATA = ["/a", "/b", "/é", None, "/a/b", ""]


def plan_for(emit: bool, carry: int, time_column: bool, emit_on_last: bool) -> tuple[StatePlan, StructType]:
    func = Sessionizer(GAP_MS, "event", True, True, emit=emit, n_carry=carry, emit_on_last=emit_on_last,
                       time_column=time_column)
    fields = [StructField("user_id", StringType()), StructField("session_start", TimestampType()),
              StructField("session_end", TimestampType()), StructField("event_count", LongType()),
              StructField("events", ArrayType(StringType())), StructField("closed_by", StringType())]
    if time_column:
        fields.append(StructField("session_time", TimestampType()))
    inputs = [StructField("user_id", StringType()), StructField("event_time", TimestampType()),
              StructField("data", StringType()), StructField("is_last", BooleanType())]
    if emit:
        record = [StructField("reason", StringType()), StructField("event_time", TimestampType()),
                  StructField("data", StringType()), StructField("is_last", BooleanType())]
        record += [StructField(f"c{i}", LongType()) for i in range(carry)]
        fields.append(StructField("rejected", StructType(record)))
        inputs.append(StructField("_sparkstate_reject", StringType()))
        inputs += [StructField(f"c{i}", LongType()) for i in range(carry)]
        inputs.append(StructField("_sparkstate_watermark", TimestampType()))
    out = StructType(fields)
    plan = StatePlan(
        operator="sessionize", key_columns=("user_id",), func=func, flat=True,
        state_codec=Codec.of(OpenSession, "state_type"), output_schema=out, output_encoder=encoder_for(out, "output"),
        timeout=GroupStateTimeout.EventTimeTimeout, keep_expired_state=False, state_ttl_ms=None, value_decoder=None,
        output_mode="append", has_watermark=True, streaming=True, bucket_logic=SessionLogic(func, out.names),
    )
    return plan, StructType(inputs)


def schema_for(inputs: StructType, pack: bool) -> StructType:
    """The processor's input schema as the engine builds it, packed or row by row."""
    extra = [StructField(HASH_COLUMN, LongType(), True)]
    if not pack:
        extra.append(StructField(BUCKET_COLUMN, IntegerType(), True))
    return StructType(inputs.fields + extra)


def packed(rows: list[tuple], emit: bool, carry: int) -> pd.DataFrame:
    """One bucket's input packed as the engine packs it before the shuffle (Arrow blobs)."""
    import pyarrow as pa

    cols = {
        "user_id": pa.array([r[0] for r in rows], pa.string()),
        "event_time": pa.array([r[1] for r in rows], pa.int64()).cast(pa.timestamp("ms")).cast(
            pa.timestamp("us", tz="UTC")),
        "data": pa.array([r[2] for r in rows], pa.string()),
        "is_last": pa.array([r[3] for r in rows], pa.bool_()),
    }
    if emit:
        cols["_sparkstate_reject"] = pa.array([r[4] for r in rows], pa.string())
        for i in range(carry):
            cols[f"c{i}"] = pa.array([r[5] + i for r in rows], pa.int64())
        cols["_sparkstate_watermark"] = pa.nulls(len(rows), pa.timestamp("us", tz="UTC"))
    cols[HASH_COLUMN] = pa.array([HASH[r[0]] for r in rows], pa.int64())
    cols[BUCKET_COLUMN] = pa.array([0] * len(rows), pa.int32())
    table = pa.table(cols)
    batches = list(packer(table.num_columns - 1)(iter(table.to_batches())))
    return pa.Table.from_batches(batches).to_pandas()


def frame(rows: list[tuple], emit: bool, carry: int) -> pd.DataFrame:
    """One bucket's input as PySpark hands it to the processor: naive UTC timestamps, longs as strings."""
    cols: dict = {
        "user_id": [r[0] for r in rows],
        "event_time": pd.to_datetime(pd.Series([r[1] for r in rows], dtype="float64"), unit="ms"),
        "data": pd.Series([r[2] for r in rows], dtype=object),
        "is_last": np.array([r[3] for r in rows], bool),
    }
    if emit:
        cols["_sparkstate_reject"] = pd.Series([r[4] for r in rows], dtype=object)
        for i in range(carry):
            cols[f"c{i}"] = pd.Series([str(r[5] + i) for r in rows], dtype=object)
        cols["_sparkstate_watermark"] = pd.Series([pd.NaT] * len(rows), dtype="datetime64[ns]")
    cols[HASH_COLUMN] = np.array([HASH[r[0]] for r in rows], np.int64)
    cols[BUCKET_COLUMN] = np.zeros(len(rows), np.int32)
    return pd.DataFrame(cols)


def canon(frames: list) -> list:
    """Output rows, comparable whatever the frame's column types and row order."""
    out = []
    for f in frames:
        for row in f.itertuples(index=False):
            vals = []
            for v in row:
                if isinstance(v, (pd.Timestamp,)) or hasattr(v, "tzinfo"):
                    v = None if pd.isna(v) else pd.Timestamp(v).value // 1_000_000
                elif isinstance(v, (list, tuple, np.ndarray)) and not hasattr(v, "_fields"):
                    v = tuple(v)
                elif isinstance(v, float) and np.isnan(v):
                    v = None
                elif isinstance(v, (np.integer,)):
                    v = int(v)
                vals.append(repr(v) if hasattr(v, "_fields") or isinstance(v, dict) else v)
            out.append(tuple(vals))
    return sorted(out, key=repr)


def stored(handle: Handle) -> dict:
    """Each leaf's entries, their state columns opened (a sealed leaf's pickles of equal values
    may differ in bytes)."""
    leaves = handle.maps[LEAF_VARIABLE].data
    return {lid: {k: open_entry(e) for k, e in pickle.loads(blob).items()} for (lid,), (blob,) in leaves.items()}


def events_for(rng: random.Random, batch: int, watermark: int, emit: bool) -> list[tuple]:
    rows = []
    for _ in range(rng.randint(0, 30)):
        t = T0 + batch * 100_000 + rng.randint(-150_000, 200_000)
        if rng.random() < 0.3:
            t -= t % 1000  # equal times
        reason = None
        if emit and rng.random() < 0.05:
            reason = "future: too far ahead"
        if emit and rng.random() < 0.04:
            t = None
        elif not emit and t <= watermark:
            continue  # Spark drops it
        rows.append((rng.choice(KEYS), t, rng.choice(DATA), rng.random() < 0.15, reason, rng.randint(0, 99)))
    rng.shuffle(rows)
    return rows


SHAPES = [
    dict(emit=False, carry=0, time_column=False, emit_on_last=False),
    dict(emit=True, carry=2, time_column=False, emit_on_last=False),
    dict(emit=True, carry=0, time_column=True, emit_on_last=False),
    dict(emit=False, carry=0, time_column=False, emit_on_last=True),
    dict(emit=True, carry=1, time_column=True, emit_on_last=True),
]


@pytest.mark.parametrize("pack", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(k for k, v in s.items() if v) or "default")
def test_the_columnar_sessionizer_does_what_the_per_key_one_does(shape, pack):
    plan, inputs = plan_for(**shape)
    schema = schema_for(inputs, pack)
    emit = shape["emit"]
    make = packed if pack else frame
    compared = sessions = refused = 0
    for seed in range(40):
        rng = random.Random(seed)
        procs = []
        for cls in (LogicProcessor, BucketProcessor):
            p = cls(plan, 64, 4, schema, packed=pack, tz="UTC")  # 4 keys a leaf: leaves split
            p.init(Handle())
            procs.append(p)
        wm = 0
        latest = 0
        for b in range(rng.randint(1, 7)):
            rows = events_for(rng, b, wm, emit)
            outs = []
            for p in procs:
                if rows:
                    got = list(p.handleInputRows((0,), iter([make(rows, emit, shape["carry"])]), Times(b, wm)))
                else:  # a batch without input: only the bucket's timer fires
                    got = list(p.handleExpiredTimer((0,), Times(b, wm), None))
                outs.append(canon(got))
            assert outs[0] == outs[1], f"seed {seed}, batch {b}"
            assert stored(procs[0].handle) == stored(procs[1].handle), f"seed {seed}, batch {b}"
            assert procs[0].handle.timers == procs[1].handle.timers
            assert procs[0].handle.values.keys() == procs[1].handle.values.keys()
            compared += 1
            sessions += sum(1 for r in outs[0] if r[1] is not None)
            refused += sum(1 for r in outs[0] if r[1] is None)
            latest = max([latest] + [r[1] for r in rows if r[1] is not None])
            wm = max(wm, latest - 20_000)
        # the end of the stream: the watermark passes every session
        outs = [canon(list(p.handleExpiredTimer((0,), Times(99, latest + 10 * GAP_MS), None))) for p in procs]
        assert outs[0] == outs[1], f"seed {seed}, last batch"
        assert stored(procs[0].handle) == stored(procs[1].handle)
        assert not any(stored(procs[0].handle).values())  # every session was emitted
    # the comparison saw what it should
    assert compared > 100 and sessions > 100
    assert refused > 10 if emit else refused == 0


def test_a_state_of_the_single_session_layout_reads_back_as_in_the_per_key_path():
    """A checkpoint of an earlier sparkstate holds one open session per key without its events'
    times; the columnar path spreads them as OpenSession.sessions() does."""
    plan, inputs = plan_for(emit=False, carry=0, time_column=False, emit_on_last=False)
    schema = schema_for(inputs, False)
    codec = Codec.of(OpenSession)
    old = OpenSession(T0, T0 + 30_000, ["/a", "/b", "/c"], [], [], [])
    outs, leaves = [], []
    for cls in (LogicProcessor, BucketProcessor):
        p = cls(plan, 64, 64, schema, packed=False, tz="UTC")
        p.init(Handle())
        d = p.store.load_dir()
        p.store.put_initial_leaf(d, 1, {"u1": [codec.encode_columns(old), T0 + 30_000 + GAP_MS, HASH["u1"]]})
        p.store.write_dir(d)
        rows = [("u1", T0 + 40_000, "/d", False, None, 0), ("u2", T0 + 5_000, "/x", True, None, 0)]
        outs.append(canon(list(p.handleInputRows((0,), iter([frame(rows, False, 0)]), Times(0, T0)))))
        outs[-1] += canon(list(p.handleExpiredTimer((0,), Times(1, T0 + 200_000), None)))
        leaves.append(stored(p.handle))
    assert outs[0] == outs[1]
    assert [r[4] for r in outs[0] if r[0] == "u1"] == [("/a", "/b", "/c", "/d")]
    assert leaves[0] == leaves[1]


# --- the inband engine: the same logic over a bucket's one state row -------------------------------

class InBandBucket:
    """One bucket as Spark's applyInPandasWithState keeps it: its state row and its timeout, and a
    call per micro-batch with input, or without input once the watermark is past the timeout; the
    state handle is PySpark's own GroupState, read back as Spark reads it (``GroupState.json``)."""

    def __init__(self, processor) -> None:
        self.processor = processor
        self.blob: bytes | None = None
        self.timeout: int | None = None

    def batch(self, frames: list, b: int, wm: int) -> list | None:
        from pyspark.sql import Row
        from pyspark.sql.streaming.state import GroupState

        from sparkstate.engines.inband.layout import STATE_SCHEMA

        timed_out = not frames and self.timeout is not None and self.timeout < wm
        if not frames and not timed_out:
            return None  # Spark does not call the bucket
        gs = GroupState(None if self.blob is None else Row(self.blob), b, wm, "EventTimeTimeout", timed_out, True,
                        self.blob is not None, False, False, -1, b"", STATE_SCHEMA)
        out = list(self.processor((0,), iter(frames), gs))
        done = json.loads(gs.json())
        if done["removed"]:
            self.blob = None
        elif done["updated"]:
            self.blob = gs.get[0]
        self.timeout = None if self.blob is None or done["timeoutTimestamp"] == -1 else done["timeoutTimestamp"]
        return out

    def entries(self) -> dict:
        from sparkstate.engines.inband.layout import Bucket

        return {} if self.blob is None else Bucket.loads(self.blob).entries


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(k for k, v in s.items() if v) or "default")
def test_the_inband_engine_runs_the_columnar_sessionizer_as_its_per_key_path(shape):
    """Three buckets fed the same shuffled batches: the per-key path throughout (what released
    sparkstate wrote), the logic throughout, and the per-key path for the first batches then the
    logic on the state row it left (a checkpoint of the earlier release going on): the same output
    rows, state rows and bucket timeouts after every batch. (Sessionize's input always has an
    event-time column, so the inband engine takes it row by row.)"""
    from sparkstate.engines.inband.processor import InBandLogicProcessor, InBandProcessor

    plan, inputs = plan_for(**shape)
    pack = False
    schema = schema_for(inputs, pack)
    emit = shape["emit"]
    compared = sessions = refused = switched = 0
    for seed in range(40):
        rng = random.Random(seed)
        per_key = InBandBucket(InBandProcessor(plan, 64, 1, schema, packed=pack, tz="UTC"))
        logic = InBandBucket(InBandLogicProcessor(plan, 64, 1, schema, packed=pack, tz="UTC"))
        later = InBandBucket(InBandProcessor(plan, 64, 1, schema, packed=pack, tz="UTC"))
        switch_at = rng.randint(1, 4)
        wm = 0
        latest = 0
        for b in range(rng.randint(1, 7)):
            if b == switch_at:  # the same state row, now read by the logic
                later.processor = InBandLogicProcessor(plan, 64, 1, schema, packed=pack, tz="UTC")
                switched += bool(later.entries())
            rows = events_for(rng, b, wm, emit)
            outs = [bucket.batch([frame(rows, emit, shape["carry"])] if rows else [], b, wm)
                    for bucket in (per_key, logic, later)]
            assert (outs[0] is None) == (outs[1] is None) == (outs[2] is None)
            outs = [canon(o or []) for o in outs]
            assert outs[0] == outs[1] == outs[2], f"seed {seed}, batch {b}"
            assert per_key.entries() == logic.entries() == later.entries(), f"seed {seed}, batch {b}"
            assert per_key.timeout == logic.timeout == later.timeout
            compared += 1
            sessions += sum(1 for r in outs[0] if r[1] is not None)
            refused += sum(1 for r in outs[0] if r[1] is None)
            latest = max([latest] + [r[1] for r in rows if r[1] is not None])
            wm = max(wm, latest - 20_000)
        end = latest + 10 * GAP_MS  # the end of the stream: the watermark passes every session
        outs = [canon(bucket.batch([], 99, end) or []) for bucket in (per_key, logic, later)]
        assert outs[0] == outs[1] == outs[2], f"seed {seed}, last batch"
        assert per_key.blob is logic.blob is later.blob is None  # every session was emitted
    assert compared > 100 and sessions > 100 and switched > 5
    assert refused > 10 if emit else refused == 0
