"""What the batched engine runs on the Python workers: the packing step before the shuffle
(:func:`_packer`) and the StatefulProcessor (``transformWithStateInPandas``), one call per bucket.

Groups the bucket's input by key, reads the directory and the leaves its keys fall in (layout:
:mod:`.layout`), runs the user's function per key in a plain Python loop, finds the keys whose
timeout is due from the directory, and writes back what changed. Which keys are due, which timer
fires a timeout and when a key's entry goes are :mod:`sparkstate.group_state`'s rules.
"""

from __future__ import annotations

import bisect
import gc
import pickle
from contextlib import contextmanager
from functools import partial
from typing import Any, Iterator

from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from ...errors import StateSchemaError
from ...errors import StateTypeError
from ...group_state import DELETE, KEEP, call_error, initial_timeout, is_due, reset_state, settle, timer_for
from ...types import RowTypeError, columns_encoder, row_class
from ..call_context import Calls, time_mode
from ..state_fields import relay
from ..base import PICKLE_PROTOCOL, StatePlan
from ..columns import arrow_column_converter, output_frame_maker
from .layout import (BUCKET_COLUMN, DIR_SCHEMA, DIR_VARIABLE, HASH_COLUMN, LEAF_KEY_SCHEMA, LEAF_VALUE_SCHEMA,
                     LEAF_VARIABLE, Directory, min_timeout, place_keys, split_leaf)
from .wire import LeafIO

BLOB_COLUMN = "_sparkstate_blob"


def _group_by_key(groups: dict, hashes: dict, keys: Any, key_hashes: Any, rows: Any) -> None:
    """Add rows to their key's list, one dict step per row."""
    for k, h, r in zip(keys, key_hashes, rows):
        g = groups.get(k)
        if g is None:
            groups[k] = [r]
            hashes[k] = h
        else:
            g.append(r)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection during one bucket's call.

    A call allocates a few objects per input row and per key (Rows, state values, outputs) and
    keeps most of them until it returns; with the collector on, that many surviving objects
    set off collection after collection, each walking everything allocated so far (measured:
    half the cost of grouping the input). Cycles made during the call are collected after it.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _key_cuts(table: Any, key_pos: list[int], n: int) -> Any:
    """Positions where the key changes from the row before (a null key counts as a change)."""
    import numpy as np
    import pyarrow.compute as pc

    if n < 2:
        return np.zeros(0, np.int64)
    changed = None
    for i in key_pos:
        col = table.column(i)
        neq = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True)
        changed = neq if changed is None else pc.or_(changed, neq)
    return np.flatnonzero(changed.to_numpy(zero_copy_only=False)) + 1


class _Processor(StatefulProcessor, Calls):
    """transformWithStateInPandas processor; the grouping key is the bucket."""

    def __init__(self, plan: StatePlan, buckets: int, leaf_rows: int, value_schema: StructType,
                 packed: bool = True, tz: str = "UTC") -> None:
        self.plan = plan
        self.mode = time_mode(plan)
        self.buckets = buckets
        self.leaf_rows = leaf_rows
        self.value_schema = value_schema
        self.packed = packed
        self.tz = tz

    def init(self, handle: Any) -> None:
        plan = self.plan
        self.handle = handle
        self.dir_state = handle.getValueState(DIR_VARIABLE, DIR_SCHEMA)
        self.leaf_state = handle.getMapState(LEAF_VARIABLE, LEAF_KEY_SCHEMA, LEAF_VALUE_SCHEMA)
        self.leaf_io = LeafIO(self.leaf_state)
        self._blobs: dict[int, bytes] = {}  # the stored bytes of the leaves read for this call
        self.timers = self.mode != "None"
        self.start_task(plan)
        self.fields = tuple(plan.state_codec.fields)
        # the input's columns, then the key hash (packed), or then the bucket and the hash
        names = list(self.value_schema.names)
        self.n_values = len(names) - (1 if self.packed else 2)
        self.value_names = names[: self.n_values]
        self.key_pos = [names.index(k) for k in plan.key_columns]
        self.hash_pos = names.index(HASH_COLUMN)
        fields = self.value_schema.fields[: self.n_values]
        if self.packed:
            self.converters = [arrow_column_converter(f.dataType) for f in fields]
        else:
            from .pandas_columns import pandas_column_converter, zone

            tz = zone(self.tz)
            self.converters = [pandas_column_converter(f.dataType, tz) for f in fields]
        self.encode_output_columns = columns_encoder(plan.output_schema, "output")
        self.output_frame = output_frame_maker(plan.output_schema)
        self.encode_state_cols, self.decode_state_cols = plan.state_codec.columns_coders()
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
                f"{self.plan.operator}: this checkpoint's state is hashed into {d.buckets} buckets and the query"
                f" into {self.buckets}. Pass the operator checkpoint= (the checkpoint's count is then used) or"
                f" engine=ss.BatchedEngine(buckets={d.buckets}); to change the count, rescale: export the state"
                " and start on a new checkpoint with it as initial_state (docs/cluster.md, Rescaling)."
            )
        return d

    def _load_leaves(self, d: Directory, need: set[int]) -> dict[int, dict]:
        """The entries of the leaves in ``need``: reads in windows (:class:`.wire.LeafIO`), or,
        when most of the bucket's stored leaves are needed, one scan of the bucket's map state.
        Each leaf's blob is kept, so that :meth:`_save` writes only the leaves that changed."""
        stored = [lid for lid in need if d.leaves[lid][0]]
        out = {lid: {} for lid in need if not d.leaves[lid][0]}
        blobs = self._blobs = {}
        if len(stored) >= 8 and len(stored) * 2 >= sum(1 for c, _ in d.leaves.values() if c):
            for (lid,), (blob,) in self.leaf_state.iterator():
                if lid in need:
                    blobs[lid] = blob
        else:
            for lid, blob in zip(stored, self.leaf_io.get_many(stored)):
                if blob is not None:
                    blobs[lid] = blob
        for lid in stored:
            blob = blobs.get(lid)
            out[lid] = {} if blob is None else self._unpickle(d, blob)
        return out

    def _unpickle(self, d: Directory, blob: bytes) -> dict:
        entries = pickle.loads(blob)
        return self._evolve(d.fields, entries) if d.fields != self.fields else entries

    def _evolve(self, stored: tuple[str, ...], entries: dict) -> dict:
        """Re-lay state columns written with ``stored`` field names as the current fields."""
        idx = self._remap.get(stored)
        if idx is None:
            idx = self._remap[stored] = relay(stored, self.fields)
        for e in entries.values():
            cols = e[0]
            if cols is not None:
                e[0] = tuple(None if i is None else cols[i] for i in idx)
        return entries

    def _save(self, d: Directory, changed: dict[int, dict]) -> bool:
        """Write the leaves that changed (splitting the big ones), in windows, and refresh their
        directory entries; True if the directory changed (else it need not be written)."""
        blobs = self._blobs
        puts: list = []
        removes: list = []
        moved = False
        for lid, entries in changed.items():
            parts = split_leaf(lid, entries, self.leaf_rows) if len(entries) > self.leaf_rows else {lid: entries}
            if lid not in parts:
                del d.leaves[lid]
                removes.append(lid)
                moved = True
            for pid, ents in parts.items():
                meta = [len(ents), min_timeout(ents)]
                if d.leaves.get(pid) != meta:
                    d.leaves[pid] = meta
                    moved = True
                if ents:
                    blob = pickle.dumps(ents, PICKLE_PROTOCOL)
                    if blobs.get(pid) != blob:
                        puts.append((pid, blob))
                elif pid == lid and lid in blobs:
                    removes.append(pid)
        self.leaf_io.write_many(puts, removes)
        if d.fields != self.fields or d.state_schema != self.state_schema:
            d.fields = self.fields
            d.state_schema = self.state_schema
            moved = True
        return moved

    def _arm(self, d: Directory, now: int) -> None:
        """Keep exactly one timer per bucket, at its earliest timeout (+1: timeouts are strict)."""
        if not self.timers:
            return
        m = d.earliest()
        want = None if m is None else timer_for(m, now)
        if want == d.timer:
            return
        if d.timer is not None and d.timer > now:
            self.handle.deleteTimer(d.timer)
        # A timer at or before `now` is firing in this batch; transformWithState removes it.
        if want is not None:
            self.handle.registerTimer(want)
        d.timer = want

    # -- the user's function, key after key -----------------------------------------------------
    def _run_keys(self, calls: list, timed_out: bool, state: Any, out: list, owners: list) -> None:
        """Call the user's function for each ``(leaf, key, hash, rows)`` of ``calls`` and apply
        what :func:`~sparkstate.group_state.settle` decides to the key's entry in its leaf.

        The per-key work is kept to the loop itself: one ``GroupState`` reset per key (not a new
        one), outputs collected raw (encoded as columns once, in :meth:`_frame`), and for each
        output run the key it came from (``owners``: end index, key) to name it in errors.
        """
        plan = self.plan
        func, flat, keep = plan.func, plan.flat, plan.keep_expired_state
        decode, encode = self.decode_state_cols, self.encode_state_cols
        append, extend = out.append, out.extend
        for leaf, k, h, rows in calls:
            entry = leaf.get(k)
            if entry is None:
                reset_state(state, None, False, timed_out)
                old = None
            else:
                cols, old = entry[0], entry[1]
                if cols is None:
                    reset_state(state, None, False, timed_out)
                else:
                    reset_state(state, decode(cols), True, timed_out)
            try:
                result = func(k, iter(rows), state)
                if result is not None:
                    if flat:
                        extend(result)
                    else:
                        append(result)
            except Exception as exc:
                raise call_error(func, k, exc) from exc
            if result is not None:
                owners.append((len(out), k))
            verdict = settle(state, old, keep)
            if verdict == KEEP:
                continue
            if verdict == DELETE:
                leaf.pop(k, None)
                continue
            try:
                cols = encode(state.getOption) if state.exists else None
            except StateTypeError as exc:
                raise StateTypeError(f"{plan.operator}: the state of key {k!r} cannot be stored: {exc}") from None
            leaf[k] = [cols, state.timeout_ms, h]

    # -- the transformWithState callbacks -------------------------------------------------------
    def _group_rows(self, frames: Iterator[Any]) -> tuple[dict, dict]:
        """Unpacked input (pandas chunks of rows) -> key -> [values], key -> hash."""
        groups: dict = {}
        hashes: dict = {}
        for pdf in frames:
            if len(pdf) == 0:
                continue
            keys, rows = self._keys_and_rows([conv(pdf.iloc[:, i]) for i, conv in enumerate(self.converters)])
            _group_by_key(groups, hashes, keys, pdf.iloc[:, self.hash_pos].tolist(), rows)
        return groups, hashes

    def _keys_and_rows(self, cols: list[list]) -> tuple[list, list]:
        """Converted input columns -> the key of each row, and each row as the function sees it."""
        kp = self.key_pos
        keys = cols[kp[0]] if len(kp) == 1 else list(zip(*(cols[i] for i in kp)))
        values = zip(*cols) if self.n_values > 1 else ((v,) for v in cols[0])
        decode = self.decode_value
        make = partial(tuple.__new__, row_class(self.value_names)) if decode is None else decode
        return keys, list(map(make, values))

    def _group(self, frames: Iterator[Any]) -> tuple[dict, dict]:
        """Packed input (see :func:`_packer`) -> key -> [values] (Row API values), key -> hash."""
        if not self.packed:
            return self._group_rows(frames)
        import numpy as np
        import pyarrow as pa

        tables = [pa.ipc.open_stream(blob).read_all() for pdf in frames for blob in pdf.iloc[:, 1].tolist()]
        groups: dict = {}
        hashes: dict = {}
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return groups, hashes
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        # Sort by key hash (stable: a key's rows keep their order), so each key's rows are one
        # run; the per-row work left is building the Row values, in C-level loops.
        h = table.column(self.hash_pos).to_numpy()
        order = np.argsort(h, kind="stable")
        h = h[order]
        table = table.take(order)
        cuts = np.flatnonzero(h[1:] != h[:-1]) + 1
        keys, rows = self._keys_and_rows([conv(table.column(i)) for i, conv in enumerate(self.converters)])
        hashes_at = h.tolist()
        if _key_cuts(table, self.key_pos, len(h)).tolist() == cuts.tolist():
            # one run per key: no two keys share a hash, no null key
            bounds = [0, *cuts.tolist(), len(h)]
            for s, e in zip(bounds, bounds[1:]):
                k = keys[s]
                groups[k] = rows[s:e]
                hashes[k] = hashes_at[s]
            return groups, hashes
        _group_by_key(groups, hashes, keys, hashes_at, rows)  # null keys, or two keys with one hash
        return groups, hashes

    def _touch(self, d: Directory, key_hashes: list[int], now: int) -> tuple[list[int], list[int], dict[int, dict]]:
        """The leaf of each key hash, the leaves holding a due timeout, and every leaf the call
        needs, read: those two, or all of the bucket's when its state type changed (the
        directory records one field layout for the whole bucket, so they are all re-laid now)."""
        leaves = d.leaves
        lids = place_keys(leaves, key_hashes)
        need = set(lids)
        if d.fields != self.fields:
            need.update(lid for lid, (count, _) in leaves.items() if count)
        due: list[int] = []
        if self.timers:
            due = [lid for lid, (_, m) in leaves.items() if m is not None and is_due(m, now)]
            need.update(due)
        return lids, due, self._load_leaves(d, need)

    def _process(self, groups: dict, hashes: dict, tv: Any) -> list:
        pt, wm = self.times(tv)
        now = self.now(pt, wm)
        d = self._load_dir()
        key_hashes = [hashes[k] for k in groups]
        lids, due, touched = self._touch(d, key_hashes, now)
        out: list = []
        owners: list = []
        state = self.group_state(None, False, pt, wm, False)
        self._run_keys([(touched[lid], k, h, groups[k]) for k, h, lid in zip(groups, key_hashes, lids)],
                       False, state, out, owners)
        expired = []
        for lid in due:
            leaf = touched[lid]
            for k, e in leaf.items():
                t = e[1]
                if t is not None and k not in groups and is_due(t, now):
                    expired.append((leaf, k, e[2], ()))
        if expired:
            self._run_keys(expired, True, state, out, owners)
        changed = self._save(d, touched) if touched else False
        before = d.timer
        self._arm(d, now)
        if changed or d.timer != before or d.fresh:
            self.dir_state.update((d.dumps(),))
        return [self._frame(out, owners)] if out else []

    def _frame(self, outputs: list, owners: list) -> Any:
        """The outputs as one pandas DataFrame, encoded column by column."""
        try:
            cols = self.encode_output_columns(outputs)
        except RowTypeError as exc:
            key = owners[bisect.bisect_right(owners, exc.index, key=lambda o: o[0])][1]
            raise StateTypeError(
                f"{self.plan.operator}: an output for key {key!r} does not match output_type: {exc}"
            ) from None
        return self.output_frame(cols)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        with _gc_paused():
            groups, hashes = self._group(rows)
            return iter(self._process(groups, hashes, timerValues))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        with _gc_paused():
            return iter(self._process({}, {}, timerValues))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        # Each row is one whole leaf, built by Spark from the initial state (see _initial_leaves).
        if len(initialState) == 0:
            return
        pt, wm = self.times(timerValues)
        d = self._load_dir()
        conf, idle = self.plan.timeout, self.plan.initial_idle_timeout_ms
        for lid, blob in zip(initialState.iloc[:, 1].tolist(), initialState.iloc[:, 2].tolist()):  # bucket, leaf, blob
            entries = pickle.loads(blob)
            if idle is not None:  # the leaves were built without the first batch's time (engine._initial_leaves)
                for e in entries.values():
                    e[1] = initial_timeout(conf, e[1], idle, pt)
            lid = int(lid)
            if lid != 1 and d.leaves.get(1) == [0, None]:
                del d.leaves[1]  # the initial layout covers the bucket: it replaces the empty root
            d.leaves[lid] = [len(entries), min_timeout(entries)]
            if entries:
                self.leaf_state.updateValue((lid,), (pickle.dumps(entries, PICKLE_PROTOCOL),))
        self._arm(d, self.now(pt, wm))
        self.dir_state.update((d.dumps(),))

    def close(self) -> None:
        pass


PACKED_SCHEMA = StructType([StructField(BUCKET_COLUMN, IntegerType(), True),
                            StructField(BLOB_COLUMN, BinaryType(), True)])
_PACK_ROWS = 1 << 16
_PACK_BYTES = 1 << 28  # a blob column's offsets are 32-bit: stay far below 2 GiB


def _packer(bucket_pos: int) -> Any:
    """The ``mapInArrow`` function run before the shuffle: it cuts each partition's rows by
    bucket into Arrow IPC blobs, one row ``(bucket, blob)`` per bucket and up to 64K input rows
    (or 256 MB).

    PySpark feeds transformWithStateInPandas row by row (a pandas ``itertuples`` and a
    DataFrame rebuilt per group); packed, it sees a few rows per bucket, and the Spark side
    shuffles and sorts a few rows instead of every event. The blob holds the input's columns
    and the key hash, in Spark's own Arrow types, so nothing is lost on the way.
    """

    def pack(batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        def cut(chunk: list) -> Iterator[Any]:
            table = pa.Table.from_batches(chunk).combine_chunks()
            table = table.take(pc.sort_indices(table.column(bucket_pos)))
            buckets = table.column(bucket_pos).to_numpy()
            body = table.select(range(bucket_pos))
            # every bucket's slice as its own IPC stream, back to back in one buffer: the blob
            # column is that buffer with the streams' offsets (no copy per blob)
            sink = pa.BufferOutputStream()
            out_b, offsets = [], [0]
            start, n = 0, len(buckets)
            while start < n:
                b = buckets[start]
                end = int(buckets.searchsorted(b, "right"))
                with pa.ipc.new_stream(sink, body.schema) as w:
                    w.write_table(body.slice(start, end - start))
                out_b.append(int(b))
                offsets.append(sink.tell())
                start = end
                if offsets[-1] >= _PACK_BYTES or start == n:
                    blobs = pa.Array.from_buffers(
                        pa.binary(), len(out_b), [None, pa.py_buffer(np.array(offsets, np.int32)), sink.getvalue()])
                    yield pa.RecordBatch.from_arrays([pa.array(out_b, pa.int32()), blobs],
                                                     names=[BUCKET_COLUMN, BLOB_COLUMN])
                    sink, out_b, offsets = pa.BufferOutputStream(), [], [0]

        chunk: list = []
        rows = size = 0
        for batch in batches:
            if batch.num_rows:
                chunk.append(batch)
                rows += batch.num_rows
                size += batch.nbytes
            if rows >= _PACK_ROWS or size >= _PACK_BYTES:
                yield from cut(chunk)
                chunk, rows, size = [], 0, 0
        if chunk:
            yield from cut(chunk)

    return pack
