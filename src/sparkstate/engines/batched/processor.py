"""The batched engine's StatefulProcessor (``transformWithStateInPandas``, one call per bucket
and micro-batch): the bucket's input grouped by key (:mod:`.grouping`), the leaves its keys and
due timeouts fall in read (:mod:`.bucket_store`), the user's function run per key in a plain
Python loop (:meth:`BucketProcessor.run_keys`; with ``StatePlan.every_key``, then every other
stored key of the bucket, with no rows), and what changed written back. Which keys are due,
which timer fires a timeout and when a key's entry goes are :mod:`sparkstate.engines.rules`.
"""

from __future__ import annotations

import bisect
import pickle
from typing import Any, Iterator

from pyspark.sql.types import StructType

from ...errors import StateTypeError
from ...types import RowTypeError, columns_encoder
from ..base import StatePlan
from ..call_context import Calls, time_mode
from ..rules import DELETE, KEEP, call_error, due_keys, initial_timeout, settle
from ..row_values import output_frame_maker
from ..runtime import StatefulProcessor
from .bucket_store import BucketStore
from .grouping import Grouper, gc_paused
from .layout import open_entry


class BucketProcessor(StatefulProcessor, Calls):
    """transformWithStateInPandas processor; the grouping key is the bucket.

    ``value_schema``: the input as the processor gets it (see :class:`.grouping.Grouper`);
    ``packed``: whether it comes packed (:mod:`.packing`) or row by row.
    """

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
        self.prepare()
        self.store = BucketStore(handle, plan.operator, self.buckets, self.leaf_rows, tuple(plan.state_codec.fields),
                                 self.key_schema, plan.state_codec.columns.json(), self.mode != "None")

    def prepare(self) -> None:
        """What a task needs besides the state handle: the input's grouping, the coders of state
        and outputs (the inband engine runs the same per-key loop on state Spark ships in-band)."""
        plan = self.plan
        self.start_task(plan)
        self.input = Grouper(plan, self.value_schema, self.packed, self.tz)
        self.key_schema = StructType([self.value_schema[k] for k in plan.key_columns]).json()
        self.encode_output_columns = columns_encoder(plan.output_schema, "output")
        self.output_frame = output_frame_maker(plan.output_schema)
        self.encode_state_cols, self.decode_state_cols = plan.state_codec.columns_coders()

    # -- the user's function, key after key -----------------------------------------------------
    def run_keys(self, calls: list, timed_out: bool, state: Any, out: list, owners: list) -> None:
        """Call the user's function for each ``(leaf, key, hash, rows)`` of ``calls`` and apply
        what :func:`~sparkstate.engines.rules.settle` decides to the key's entry in its leaf.

        The per-key work is kept to the loop itself: one ``GroupState`` handle moved on per key (``begin_call``) (not a new
        one), outputs collected raw (encoded as columns once, in :meth:`frame`), and for each
        output run the key it came from (``owners``: end index, key) to name it in errors.
        """
        plan = self.plan
        func, flat, keep = plan.func, plan.flat, plan.keep_expired_state
        decode, encode = self.decode_state_cols, self.encode_state_cols
        append, extend = out.append, out.extend
        for leaf, k, h, rows in calls:
            entry = leaf.get(k)
            if entry is None:
                state.begin_call(None, False, timed_out)
                old = None
            else:
                cols, old = entry[0], entry[1]
                if type(cols) is bytes:  # a leaf sealed sparse (layout.open_entry)
                    cols = open_entry(entry)[0]
                if cols is None:
                    state.begin_call(None, False, timed_out)
                else:
                    state.begin_call(decode(cols), True, timed_out)
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

    def process(self, groups: dict, hashes: dict, tv: Any) -> list:
        pt, wm = self.times(tv)
        now = self.now(pt, wm)
        store = self.store
        d = store.load_dir()
        key_hashes = [hashes[k] for k in groups]
        every = self.plan.every_key
        lids, due, touched = store.touch(d, key_hashes, now, every)
        out: list = []
        owners: list = []
        state = self.group_state(None, False, pt, wm, False)
        self.run_keys([(touched[lid], k, h, groups[k]) for k, h, lid in zip(groups, key_hashes, lids)],
                      False, state, out, owners)
        if every:  # the bucket's other stored keys, with no new rows (StatePlan.every_key)
            rest = [(leaf, k, e[2], ()) for leaf in touched.values() for k, e in leaf.items() if k not in groups]
            self.run_keys(rest, False, state, out, owners)
        pending = ((k, e[1], (leaf, e[2])) for leaf in (touched[lid] for lid in due) for k, e in leaf.items())
        expired = [(leaf, k, h, ()) for k, (leaf, h) in due_keys(pending, now, groups)]
        if expired:
            self.run_keys(expired, True, state, out, owners)
        store.commit(d, touched, now)
        return [self.frame(out, owners)] if out else []

    def frame(self, outputs: list, owners: list) -> Any:
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
        with gc_paused():
            groups, hashes = self.input.group(rows)
            return iter(self.process(groups, hashes, timerValues))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        with gc_paused():
            return iter(self.process({}, {}, timerValues))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        # Each row is one whole leaf, built by Spark from the initial state (see engine.initial_leaves).
        if len(initialState) == 0:
            return
        pt, wm = self.times(timerValues)
        store = self.store
        d = store.load_dir()
        conf, idle = self.plan.timeout, self.plan.initial_idle_timeout_ms
        for lid, blob in zip(initialState.iloc[:, 1].tolist(), initialState.iloc[:, 2].tolist()):  # bucket, leaf, blob
            entries = pickle.loads(blob)
            if idle is not None:  # the leaves were built without the first batch's time (engine.initial_leaves)
                for e in entries.values():
                    e[1] = initial_timeout(conf, e[1], idle, pt)
            store.put_initial_leaf(d, int(lid), entries)
        store.arm(d, self.now(pt, wm))
        store.write_dir(d)

    def close(self) -> None:
        pass


class TableProcessor(BucketProcessor):
    """A bucket processor that takes the bucket's input as one Arrow table (``None`` on a timer
    call) in :meth:`run_table`, instead of grouped per key."""

    def run_table(self, table: Any, tv: Any) -> list:
        raise NotImplementedError

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        with gc_paused():
            return iter(self.run_table(self.input.table(rows), timerValues))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        with gc_paused():
            return iter(self.run_table(None, timerValues))
