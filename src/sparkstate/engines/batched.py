"""The batched engine: many keys per Python call, no per-key round trip to the JVM.

Layout (all of it in Spark's state store, so checkpoints, recovery and the state tools work
as for any transformWithState query):

- Keys are hashed (``xxhash64`` of the key columns, computed by Spark) into ``buckets``
  buckets; the bucket is transformWithState's grouping key, so one Python call serves every
  key of a bucket that has input in the micro-batch.
- A bucket's keys live in *leaves*: a map state ``sparkstate_leaves`` from leaf id to one
  binary value holding up to ``leaf_rows`` (64) keys (their encoded state, pending timeout and
  hash). A leaf that grows past ``leaf_rows`` splits in two on the next bit of the key hash,
  so leaves stay small however many keys the state holds: a batch reads and rewrites only
  the leaves its keys fall in, never the untouched rest of the bucket.
- A value state ``sparkstate_dir`` per bucket holds the directory: each leaf's key count and
  earliest pending timeout, the state's field names (for schema evolution) and the bucket's
  one registered timer (the earliest timeout of all its keys).

A micro-batch costs, per bucket with input, one directory read and write, and per touched
leaf one read and one write; the user's function runs for each key in a plain Python loop.
Timeouts of keys without input are found from the directory (only leaves holding a due
timeout are read) when the bucket has input or its timer fires.
"""

from __future__ import annotations

import datetime as _dt
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from ..errors import ConfigError, StateSchemaError
from ..group_state import run_call
from ._calls import Calls, time_mode
from .base import Engine, StatePlan, initial_key_column
from ..types import row_class
from .columns import column_converter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

BUCKET_COLUMN = "_sparkstate_bucket"
HASH_COLUMN = "_sparkstate_hash"
LEAF_COLUMN = "_sparkstate_leaf"
BLOB_COLUMN = "_sparkstate_blob"
DIR_VARIABLE = "sparkstate_dir"
LEAF_VARIABLE = "sparkstate_leaves"
LAYOUT_VERSION = 1
_PICKLE = 5
_MAX_DEPTH = 32  # leaves split on the upper 32 bits of the 64-bit key hash

DIR_SCHEMA = StructType([StructField("blob", BinaryType(), True)])
LEAF_KEY_SCHEMA = StructType([StructField("leaf", LongType(), True)])
LEAF_VALUE_SCHEMA = StructType([StructField("blob", BinaryType(), True)])


def leaf_bits(h: int) -> int:
    """The hash bits leaves split on (the upper half; the bucket uses the whole hash mod B)."""
    return (h >> 32) & 0xFFFFFFFF


def leaf_of(leaves: dict, bits: int) -> int:
    """The id of the leaf holding a key: leaf ids are ``(1 << depth) | prefix``."""
    depth = 0
    while True:
        lid = (1 << depth) | (bits & ((1 << depth) - 1))
        if lid in leaves:
            return lid
        depth += 1
        if depth > _MAX_DEPTH:
            raise StateSchemaError(f"batched engine: no leaf for hash bits {bits:#x}; the directory is damaged")


def _depth(lid: int) -> int:
    return lid.bit_length() - 1


def split_leaf(lid: int, entries: dict, max_rows: int) -> dict[int, dict]:
    """Split a leaf until every part holds at most ``max_rows`` keys (or the hash runs out)."""
    out: dict[int, dict] = {}
    todo = [(lid, entries)]
    while todo:
        cur, ents = todo.pop()
        d = _depth(cur)
        if len(ents) <= max_rows or d >= _MAX_DEPTH:
            out[cur] = ents
            continue
        prefix = cur & ((1 << d) - 1)
        lo: dict = {}
        hi: dict = {}
        for k, e in ents.items():
            (hi if (leaf_bits(e[2]) >> d) & 1 else lo)[k] = e
        todo.append(((1 << (d + 1)) | prefix, lo))
        todo.append(((1 << (d + 1)) | (1 << d) | prefix, hi))
    return out


def _min_timeout(entries: dict) -> int | None:
    m = None
    for e in entries.values():
        t = e[1]
        if t is not None and (m is None or t < m):
            m = t
    return m


@dataclass
class Directory:
    """One bucket's directory: leaf id -> [keys, earliest timeout]."""

    buckets: int
    fields: tuple[str, ...]
    leaves: dict
    timer: int | None
    #: JSON of the key columns' and the state's Spark schemas, for the state tools.
    key_schema: str
    state_schema: str
    #: not stored yet (not saved in the blob)
    fresh: bool = False

    @staticmethod
    def new(buckets: int, fields: tuple[str, ...], key_schema: str, state_schema: str) -> "Directory":
        return Directory(buckets, fields, {1: [0, None]}, None, key_schema, state_schema, True)

    def dumps(self) -> bytes:
        return pickle.dumps((LAYOUT_VERSION, self.buckets, self.fields, self.leaves, self.timer,
                             self.key_schema, self.state_schema), _PICKLE)

    @staticmethod
    def loads(blob: bytes) -> "Directory":
        version, *rest = pickle.loads(blob)
        if version != LAYOUT_VERSION:
            raise StateSchemaError(f"batched engine: state layout version {version} is not supported (expected {LAYOUT_VERSION})")
        buckets, fields, leaves, timer, key_schema, state_schema = rest
        return Directory(buckets, tuple(fields), leaves, timer, key_schema, state_schema)

    def earliest(self) -> int | None:
        return min((m for _, m in self.leaves.values() if m is not None), default=None)


def build_leaves(entries: dict, max_rows: int) -> dict[int, dict]:
    """The leaves of a bucket holding ``entries`` (key -> [cols, timeout, hash]), from scratch."""
    return split_leaf(1, entries, max_rows)


class _Processor(StatefulProcessor, Calls):
    """transformWithStateInPandas processor; the grouping key is the bucket."""

    def __init__(self, plan: StatePlan, buckets: int, leaf_rows: int, value_schema: StructType, tz: str) -> None:
        self.plan = plan
        self.mode = time_mode(plan)
        self.buckets = buckets
        self.leaf_rows = leaf_rows
        self.value_schema = value_schema
        self.tz = tz

    def init(self, handle: Any) -> None:
        plan = self.plan
        self.handle = handle
        self.dir_state = handle.getValueState(DIR_VARIABLE, DIR_SCHEMA)
        self.leaf_state = handle.getMapState(LEAF_VARIABLE, LEAF_KEY_SCHEMA, LEAF_VALUE_SCHEMA)
        self.timers = self.mode != "None"
        self.start_task(plan)
        self.fields = tuple(plan.state_codec.fields)
        names = list(self.value_schema.names)
        self.names = names
        self.n_values = len(names) - 2  # the input's own columns; bucket and hash come last
        self.value_names = names[: self.n_values]
        self.key_pos = [names.index(k) for k in plan.key_columns]
        self.hash_pos = names.index(HASH_COLUMN)
        tz = _zone(self.tz)
        self.converters = [column_converter(f.dataType, tz) for f in self.value_schema.fields[: self.n_values]]
        self.output_names = list(plan.output_schema.names)
        self.key_schema = StructType([self.value_schema[k] for k in plan.key_columns]).json()
        self.state_schema = plan.state_codec.columns.json()
        self._remap: dict[tuple, Any] = {}

    # -- state I/O ------------------------------------------------------------------------------
    def _load_dir(self) -> Directory:
        row = self.dir_state.get()
        if row is None:
            return Directory.new(self.buckets, self.fields, self.key_schema, self.state_schema)
        d = Directory.loads(row[0])
        if d.buckets != self.buckets:
            raise StateSchemaError(
                f"{self.plan.operator}: this checkpoint's state was written with {d.buckets} buckets, the query now"
                f" asks for {self.buckets}. Use the same number, or move the state with ss.state.export and"
                " initial_state."
            )
        return d

    def _load_leaf(self, d: Directory, lid: int) -> dict:
        if d.leaves[lid][0] == 0:
            return {}
        row = self.leaf_state.getValue((lid,))
        return {} if row is None else self._unpickle(d, row[0])

    def _load_leaves(self, d: Directory, need: set[int]) -> dict[int, dict]:
        """The entries of the leaves in ``need``: one read each, or, when most of the bucket's
        stored leaves are needed, one scan of the bucket's map state (a few round trips)."""
        stored = [lid for lid in need if d.leaves[lid][0]]
        out = {lid: {} for lid in need if not d.leaves[lid][0]}
        if len(stored) >= 8 and len(stored) * 2 >= sum(1 for c, _ in d.leaves.values() if c):
            for (lid,), (blob,) in self.leaf_state.iterator():
                if lid in need:
                    out[lid] = self._unpickle(d, blob)
            for lid in stored:
                out.setdefault(lid, {})
            return out
        for lid in stored:
            out[lid] = self._load_leaf(d, lid)
        return out

    def _unpickle(self, d: Directory, blob: bytes) -> dict:
        entries = pickle.loads(blob)
        return self._evolve(d.fields, entries) if d.fields != self.fields else entries

    def _evolve(self, stored: tuple[str, ...], entries: dict) -> dict:
        """Re-lay state columns written with ``stored`` field names as the current fields."""
        idx = self._remap.get(stored)
        if idx is None:
            pos = {n: i for i, n in enumerate(stored)}
            idx = self._remap[stored] = tuple(pos.get(n) for n in self.fields)
        for e in entries.values():
            cols = e[0]
            if cols is not None:
                e[0] = tuple(None if i is None else cols[i] for i in idx)
        return entries

    def _save(self, d: Directory, changed: dict[int, dict]) -> None:
        """Write changed leaves (splitting the big ones) and refresh their directory entries."""
        for lid, entries in changed.items():
            parts = split_leaf(lid, entries, self.leaf_rows) if len(entries) > self.leaf_rows else {lid: entries}
            if lid not in parts:
                del d.leaves[lid]
                self.leaf_state.removeKey((lid,))
            for pid, ents in parts.items():
                d.leaves[pid] = [len(ents), _min_timeout(ents)]
                if ents:
                    self.leaf_state.updateValue((pid,), (pickle.dumps(ents, _PICKLE),))
                elif pid == lid:
                    self.leaf_state.removeKey((pid,))
        d.fields = self.fields
        d.state_schema = self.state_schema

    def _arm(self, d: Directory, now: int) -> None:
        """Keep exactly one timer per bucket, at its earliest timeout (+1: timeouts are strict)."""
        if not self.timers:
            return
        m = d.earliest()
        want = None if m is None else max(m + 1, now + 1)
        if want == d.timer:
            return
        if d.timer is not None and d.timer > now:
            self.handle.deleteTimer(d.timer)
        # A timer at or before `now` is firing in this batch; transformWithState removes it.
        if want is not None:
            self.handle.registerTimer(want)
        d.timer = want

    # -- one call of the user's function --------------------------------------------------------
    def _call(self, leaf: dict, key: Any, h: int, values: Any, pt: int, wm: int, timed_out: bool) -> list:
        entry = leaf.get(key)
        if entry is None:
            value, exists, old_timeout = None, False, None
        else:
            cols, old_timeout = entry[0], entry[1]
            exists = cols is not None
            value = self.codec.decode_columns(cols) if exists else None
        state = self.group_state(value, exists, pt, wm, timed_out)
        outcome = run_call(
            self.plan.func, key, values, state, flat=self.plan.flat,
            old_timeout_ms=old_timeout, keep_expired_state=self.plan.keep_expired_state,
        )
        if outcome.write:
            if not outcome.exists and outcome.timeout_ms is None:
                leaf.pop(key, None)
            else:
                cols = self.encode_state(key, outcome.value) if outcome.exists else None
                leaf[key] = [cols, outcome.timeout_ms, h]
        return self.encode_outputs(key, outcome.outputs)

    # -- the transformWithState callbacks -------------------------------------------------------
    def _group(self, frames: Iterator[Any]) -> tuple[dict, dict]:
        """Input chunks -> key -> [values] (Row API values), key -> hash."""
        groups: dict = {}
        hashes: dict = {}
        kp = self.key_pos
        single = len(kp) == 1
        decode = self.decode_value
        cls = row_class(self.value_names)
        new = tuple.__new__
        n = self.n_values
        for pdf in frames:
            if len(pdf) == 0:
                continue
            cols = [conv(pdf.iloc[:, i]) for i, conv in enumerate(self.converters)]
            hcol = pdf.iloc[:, self.hash_pos].tolist()
            keys = cols[kp[0]] if single else list(zip(*(cols[i] for i in kp)))
            rows = zip(*cols) if n > 1 else ((v,) for v in cols[0])
            for k, h, vals in zip(keys, hcol, rows):
                v = new(cls, vals) if decode is None else decode(vals)
                g = groups.get(k)
                if g is None:
                    groups[k] = [v]
                    hashes[k] = h
                else:
                    g.append(v)
        return groups, hashes

    def _process(self, groups: dict, hashes: dict, tv: Any) -> Iterator[Any]:
        pt, wm = self.times(tv)
        now = self.now(pt, wm)
        d = self._load_dir()
        leaves = d.leaves
        placed = [(k, hashes[k], leaf_of(leaves, leaf_bits(hashes[k]))) for k in groups]
        need = {lid for _, _, lid in placed}
        due: list[int] = []
        if self.timers:
            due = [lid for lid, (_, m) in leaves.items() if m is not None and m < now]
            need.update(due)
        touched = self._load_leaves(d, need)
        out: list = []
        for k, h, lid in placed:
            out.extend(self._call(touched[lid], k, h, iter(groups[k]), pt, wm, False))
        for lid in due:
            leaf = touched[lid]
            for k, e in list(leaf.items()):
                t = e[1]
                if t is not None and t < now and k not in groups:
                    out.extend(self._call(leaf, k, e[2], iter(()), pt, wm, True))
        if touched:
            self._save(d, touched)
        before = d.timer
        self._arm(d, now)
        if touched or d.timer != before or d.fresh:
            self.dir_state.update((d.dumps(),))
        if out:
            yield self._frame(out)

    def _frame(self, rows: list) -> Any:
        import pandas as pd

        return pd.DataFrame.from_records(rows, columns=self.output_names)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        groups, hashes = self._group(rows)
        return self._process(groups, hashes, timerValues)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        return self._process({}, {}, timerValues)

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        # Each row is one whole leaf, built by Spark from the initial state (see _initial_leaves).
        if len(initialState) == 0:
            return
        pt, wm = self.times(timerValues)
        d = self._load_dir()
        idle = self.plan.initial_idle_timeout_ms
        for lid, blob in zip(initialState.iloc[:, 1].tolist(), initialState.iloc[:, 2].tolist()):  # bucket, leaf, blob
            entries = pickle.loads(blob)
            if idle is not None and self.timers:
                for e in entries.values():
                    if e[1] is None:
                        e[1] = pt + idle
            lid = int(lid)
            if lid != 1 and d.leaves.get(1) == [0, None]:
                del d.leaves[1]  # the initial layout covers the bucket: it replaces the empty root
            d.leaves[lid] = [len(entries), _min_timeout(entries)]
            if entries:
                self.leaf_state.updateValue((lid,), (pickle.dumps(entries, _PICKLE),))
        self._arm(d, self.now(pt, wm))
        self.dir_state.update((d.dumps(),))

    def close(self) -> None:
        pass


def _zone(name: str) -> _dt.tzinfo:
    if name.upper() in ("UTC", "Z", "GMT", "ETC/UTC"):
        return _dt.timezone.utc
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(name)
    except Exception:
        return _dt.timezone.utc


def _initial_leaves(initial: "DataFrame", plan: StatePlan, buckets: int, leaf_rows: int) -> "DataFrame":
    """Group an initial-state DataFrame (engine layout) into whole leaves, one row per leaf."""
    from pyspark.sql import functions as F

    n_keys = len(plan.key_columns)
    key_cols = [initial_key_column(i) for i in range(n_keys)]
    h = F.xxhash64(*[F.col(c) for c in key_cols])
    with_hash = initial.select("*", F.pmod(h, F.lit(buckets)).cast("int").alias(BUCKET_COLUMN), h.alias(HASH_COLUMN))
    codec = plan.state_codec
    fields = list(codec.fields)
    has_timeout = plan.initial_has_timeout
    no_timeout = plan.timeout.value == "NoTimeout"
    operator = plan.operator
    single = n_keys == 1

    def build(table: Any) -> Any:
        import pyarrow as pa

        rows = table.to_pylist()
        entries: dict = {}
        bucket = None
        for r in rows:
            bucket = r[BUCKET_COLUMN]
            k = r[key_cols[0]] if single else tuple(r[c] for c in key_cols)
            value = codec.decode_columns(tuple(r[f] for f in fields))
            try:
                cols = codec.encode_columns(value)
            except Exception as exc:
                raise StateSchemaError(f"{operator}: the initial state of key {k!r} cannot be stored: {exc}") from None
            t = r.get("timeout_ms") if has_timeout and not no_timeout else None
            entries[k] = [cols, t, r[HASH_COLUMN]]
        leaves = build_leaves(entries, leaf_rows)
        out_b, out_l, out_blob = [], [], []
        for lid, ents in leaves.items():  # empty leaves too: together they cover the bucket
            out_b.append(bucket)
            out_l.append(lid)
            out_blob.append(pickle.dumps(ents, _PICKLE))
        return pa.table({BUCKET_COLUMN: pa.array(out_b, pa.int32()), LEAF_COLUMN: pa.array(out_l, pa.int64()),
                         BLOB_COLUMN: pa.array(out_blob, pa.binary())})

    schema = StructType([
        StructField(BUCKET_COLUMN, IntegerType(), True),
        StructField(LEAF_COLUMN, LongType(), True),
        StructField(BLOB_COLUMN, BinaryType(), True),
    ])
    return with_hash.groupBy(BUCKET_COLUMN).applyInArrow(build, schema)


class BatchedEngine(Engine):
    """Runs a plan with ``transformWithStateInPandas`` grouped by hash bucket (see module doc).

    ``buckets``: how many groups keys are hashed into (fixed for the life of a checkpoint);
    ``leaf_rows``: the most keys a leaf holds before it splits.
    """

    name = "batched"

    def __init__(self, buckets: int = 64, leaf_rows: int = 64) -> None:
        if int(buckets) < 1 or int(leaf_rows) < 1:
            raise ConfigError(f"batched engine: buckets and leaf_rows must be 1 or more, got {buckets}, {leaf_rows}")
        self.buckets = int(buckets)
        self.leaf_rows = int(leaf_rows)

    def apply(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        from pyspark.sql import functions as F

        if plan.state_ttl_ms is not None:
            raise ConfigError(
                f"{plan.operator}: state_ttl is not supported by the batched engine (it relies on Spark's per-key"
                " value-state TTL). Pass engine='tws', or expire state with a timeout."
            )
        clash = [c for c in df.columns if c in (BUCKET_COLUMN, HASH_COLUMN)]
        if clash:
            raise ConfigError(f"{plan.operator}: the input has reserved column(s) {', '.join(clash)}; rename them")
        h = F.xxhash64(*[F.col(c) for c in plan.key_columns])
        # longs travel as strings: pandas would turn a long column with a null into float64
        values = [F.col(f"`{f.name}`").cast("string").alias(f.name) if isinstance(f.dataType, LongType)
                  else F.col(f"`{f.name}`") for f in df.schema.fields]
        extra = [F.pmod(h, F.lit(self.buckets)).cast("int").alias(BUCKET_COLUMN), h.alias(HASH_COLUMN)]
        data = df.select(*values, *extra)
        schema = StructType(df.schema.fields + [StructField(BUCKET_COLUMN, IntegerType(), True),
                                                StructField(HASH_COLUMN, LongType(), True)])
        tz = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
        processor = _Processor(plan, self.buckets, self.leaf_rows, schema, tz)
        init = None
        if initial_state is not None:
            init = _initial_leaves(initial_state, plan, self.buckets, self.leaf_rows).groupBy(BUCKET_COLUMN)
        return data.groupBy(BUCKET_COLUMN).transformWithStateInPandas(
            statefulProcessor=processor,
            outputStructType=plan.output_schema,
            outputMode="Append" if plan.output_mode == "append" else "Update",
            timeMode=time_mode(plan),
            initialState=init,
        )
