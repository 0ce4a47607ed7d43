"""One bucket's state in Spark's state store, as the batched engine's processors read and write it
during a call: the directory (a value-state variable) and the leaves it points to (a map-state
variable), laid out as :mod:`.layout` describes, and the bucket's one timer.

A call loads the directory (:meth:`BucketStore.load_dir`), then the leaves its keys and due
timeouts fall in (:meth:`BucketStore.touch`), changes the leaves' entries in place, and hands them
back (:meth:`BucketStore.commit`): each leaf sealed or whole, and split past a size, by how many
of its keys the call ran with input for (:func:`.layout.seal_leaf`, :func:`.layout.split_rows`),
only the leaves whose bytes changed written, the timer moved to the earliest pending timeout,
and the directory written when it changed (or was stored by an older layout version).
"""

from __future__ import annotations

import os
import pickle
from collections import Counter
from typing import Any

from ...errors import StateSchemaError
from ..base import PICKLE_PROTOCOL
from ..rules import due_keys, is_due, timer_for
from ..state_fields import relay
from .layout import DIR_SCHEMA, DIR_VARIABLE, LAYOUT_VERSION, LEAF_KEY_SCHEMA, LEAF_VALUE_SCHEMA, LEAF_VARIABLE, \
    Directory, min_timeout, open_entry, place_keys, scans, seal_leaf, split_leaf, split_rows
from .wire import LeafIO

#: For measuring the read choice (benchmarks only): ``scan`` or ``key`` forces one way of reading
#: leaves in every call (set on the executors, e.g. ``spark.executorEnv.SPARKSTATE_FORCE_READS``)
FORCED_READS = os.environ.get("SPARKSTATE_FORCE_READS") or None


class BucketStore:
    """The state variables of the bucket a call serves (``handle``: transformWithState's).

    ``fields``, ``key_schema`` and ``state_schema``: what the query stores now (a directory
    written with other state fields is re-laid as these, :mod:`..state_fields`); ``timers``:
    whether the query has timeouts (else no timer is ever registered).
    """

    def __init__(self, handle: Any, operator: str, buckets: int, leaf_rows: int, fields: tuple[str, ...],
                 key_schema: str, state_schema: str, timers: bool) -> None:
        self.handle = handle
        self.operator = operator
        self.buckets = buckets
        self.leaf_rows = leaf_rows
        self.fields = fields
        self.key_schema = key_schema
        self.state_schema = state_schema
        self.timers = timers
        self.dir_state = handle.getValueState(DIR_VARIABLE, DIR_SCHEMA)
        self.leaf_state = handle.getMapState(LEAF_VARIABLE, LEAF_KEY_SCHEMA, LEAF_VALUE_SCHEMA)
        self.leaf_io = LeafIO(self.leaf_state)
        self._blobs: dict[int, bytes] = {}  # the stored bytes of the leaves read for this call
        #: how many of each leaf's keys this call runs with input (what :meth:`save` seals a leaf by;
        #: ``None``: the call visits every key of the bucket)
        self._called: dict[int, int] | None = {}
        self._remap: dict[tuple, Any] = {}

    # -- reading ----------------------------------------------------------------------------------
    def load_dir(self) -> Directory:
        row = self.dir_state.get()
        if row is None:
            return Directory.new(self.buckets, self.fields, self.key_schema, self.state_schema)
        d = Directory.loads(row[0])
        if d.buckets != self.buckets:
            raise StateSchemaError(
                f"{self.operator}: this checkpoint's state is hashed into {d.buckets} buckets and the query"
                f" into {self.buckets}. Pass the operator checkpoint= (the checkpoint's count is then used) or"
                f" engine=ss.BatchedEngine(buckets={d.buckets}); to change the count, rescale: export the state"
                " and start on a new checkpoint with it as initial_state (docs/cluster.md, Rescaling)."
            )
        return d

    def touch(self, d: Directory, key_hashes: list[int], now: int,
              every: bool = False) -> tuple[list[int], list[int], dict[int, dict]]:
        """The leaf of each key hash, the leaves holding a due timeout, and every leaf the call
        needs, read: those two, or all of the bucket's when its state type changed (the
        directory records one field layout for the whole bucket, so they are all re-laid now) or
        when the call visits ``every`` key of the bucket. How many of each leaf's keys have input
        is kept for :meth:`save` (:func:`.layout.seal_leaf`)."""
        leaves = d.leaves
        lids = place_keys(leaves, key_hashes)
        need = set(lids)
        self._called = None if every else Counter(lids)
        if every or d.fields != self.fields:
            need.update(lid for lid, (count, _) in leaves.items() if count)
        due: list[int] = []
        if self.timers:
            due = [lid for lid, (_, m) in leaves.items() if m is not None and is_due(m, now)]
            need.update(due)
        return lids, due, self.load_leaves(d, need)

    def load_leaves(self, d: Directory, need: set[int]) -> dict[int, dict]:
        """The entries of the leaves in ``need``: reads in windows (:class:`.wire.LeafIO`), or,
        when most of the bucket's stored leaves are needed, one scan of the bucket's map state.
        Each leaf's blob is kept, so that :meth:`save` writes only the leaves that changed."""
        stored = [lid for lid in need if d.leaves[lid][0]]
        out: dict[int, dict] = {lid: {} for lid in need if not d.leaves[lid][0]}
        blobs = self._blobs = {}
        if scans(len(stored), d.stored_leaves()) if FORCED_READS is None else FORCED_READS == "scan":
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
            cols = open_entry(e)[0]
            if cols is not None:
                e[0] = tuple(None if i is None else cols[i] for i in idx)
        return entries

    @staticmethod
    def timed_out(touched: dict, due: list[int], now: int, with_rows: Any) -> list[tuple]:
        """The keys of the ``due`` leaves whose timeout is due and that have no new rows
        (``with_rows``), as :func:`~sparkstate.engines.rules.due_keys` orders them: ``(key, hash,
        leaf id, entry)`` each, the entry opened (:func:`.layout.open_entry`)."""
        pending = ((k, e[1], (lid, e)) for lid in due for k, e in touched[lid].items())
        return [(k, e[2], lid, open_entry(e)) for k, (lid, e) in due_keys(pending, now, with_rows)]

    # -- writing ----------------------------------------------------------------------------------
    def commit(self, d: Directory, touched: dict[int, dict], now: int) -> None:
        """Write back a call's leaves (``touched``, as :meth:`touch` returned them, changed in
        place), move the timer, and write the directory if any of that changed it."""
        changed = self.save(d, touched) if touched else False
        before = d.timer
        self.arm(d, now)
        if changed or d.timer != before or d.fresh or d.version != LAYOUT_VERSION:
            self.dir_state.update((d.dumps(),))
            d.version = LAYOUT_VERSION

    def save(self, d: Directory, changed: dict[int, dict]) -> bool:
        """Write the leaves that changed (splitting the big ones), in windows, and refresh their
        directory entries; True if the directory changed (else it need not be written)."""
        blobs, called = self._blobs, self._called
        puts: list = []
        removes: list = []
        moved = False
        for lid, entries in changed.items():
            ran = len(entries) if called is None else called.get(lid, 0)
            seal_leaf(entries, ran, len(blobs.get(lid, b"")))
            rows = split_rows(self.leaf_rows, ran, len(entries))
            parts = split_leaf(lid, entries, rows) if len(entries) > rows else {lid: entries}
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

    def arm(self, d: Directory, now: int) -> None:
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

    def put_initial_leaf(self, d: Directory, lid: int, entries: dict) -> None:
        """Store one leaf built from the initial state (:func:`.engine.initial_leaves`)."""
        if lid != 1 and d.leaves.get(1) == [0, None]:
            del d.leaves[1]  # the initial layout covers the bucket: it replaces the empty root
        d.leaves[lid] = [len(entries), min_timeout(entries)]
        if entries:
            self.leaf_state.updateValue((lid,), (pickle.dumps(entries, PICKLE_PROTOCOL),))

    def write_dir(self, d: Directory) -> None:
        self.dir_state.update((d.dumps(),))
