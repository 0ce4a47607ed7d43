"""How the batched engine stores state, and how the state tools read it back.

Layout (all of it in Spark's state store, so checkpoints, recovery and the state tools work
as for any transformWithState query):

- Keys are hashed (``xxhash64`` of the key columns, computed by Spark) into ``buckets``
  buckets, fixed when the checkpoint is created and recorded in every bucket's directory: 4 per
  state partition (64 in checkpoints written before the count followed the partitions), so
  every partition's task has buckets to run. The bucket is transformWithState's grouping key, so one Python call serves every
  key of a bucket that has input in the micro-batch. The input is packed before the shuffle
  (:func:`.packing.packer`: one Arrow IPC blob per bucket and partition chunk), so neither Spark's
  shuffle nor PySpark's row-by-row feeding of the processor sees individual events; an input
  with an event-time watermark column goes in unpacked, so that Spark still drops its late rows.
- A bucket's keys live in *leaves*: a map state ``sparkstate_leaves`` from leaf id to one
  binary value holding up to ``leaf_rows`` (64) keys (their encoded state, pending timeout and
  hash). A leaf that grows past ``leaf_rows`` splits in two on the next bit of the key hash,
  so leaves stay small however many keys the state holds: a batch reads and rewrites only
  the leaves its keys fall in, never the untouched rest of the bucket. A leaf written by a
  call that ran few of its keys splits past half as many (:func:`split_rows`): batches that
  touch one key here and there read and write smaller leaves.
- A leaf is one pickle of ``key -> [state columns, timeout, hash]``. In layout version 2 a
  key's state columns may be a pickle of their own (bytes), opened only when the key is called
  (:func:`open_entry`): a leaf whose keys a call ran with input for fewer than half of is
  written so (:func:`seal_leaf`), so a batch that touches one key of a leaf does not unpickle
  and pickle the other keys' state; a leaf most of whose keys had input, or whose keys' state
  is small (under 64 bytes a key as stored), is written with every key's columns inline, one
  pickle, as in version 1. Version 1 leaves read as they are.
- A value state ``sparkstate_dir`` per bucket holds the directory: each leaf's key count and
  earliest pending timeout, the state's field names (for schema evolution) and the bucket's
  one registered timer (the earliest timeout of all its keys).

A micro-batch costs, per bucket with input, one directory read (and a write when a leaf's
entry in it changed), and per touched leaf one read and, if its bytes changed, one write; the
reads and writes go to Spark in windows (:mod:`.wire`), not one turn each. The user's
function runs for each key in a plain Python loop.
Timeouts of keys without input are found from the directory (only leaves holding a due
timeout are read) when the bucket has input or its timer fires.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from ...errors import StateSchemaError
from ..state_fields import relayer
from ..base import PICKLE_PROTOCOL, StoredLayout, decoded_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ENGINE = "batched"
BUCKET_COLUMN = "_sparkstate_bucket"
HASH_COLUMN = "_sparkstate_hash"
DIR_VARIABLE = "sparkstate_dir"
LEAF_VARIABLE = "sparkstate_leaves"
#: the layout this release writes; it reads :data:`READABLE_VERSIONS`
LAYOUT_VERSION = 2
READABLE_VERSIONS = (1, 2)
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


#: Below this many keys, :func:`place_keys` walks the tree per key (numpy's set-up costs more).
_PLACE_VECTOR_MIN = 64


def place_keys(leaves: dict, hashes: list[int]) -> list[int]:
    """:func:`leaf_of` for many keys: the leaf id of each hash.

    The leaves cover the hash space without overlap, so a key's leaf is the one leaf whose
    prefix its bits match; this tests all keys against the leaves of one depth at a time
    (a bucket's leaves have few distinct depths) instead of walking the tree key by key.
    """
    if len(leaves) == 1:
        return [next(iter(leaves))] * len(hashes)
    if len(hashes) < _PLACE_VECTOR_MIN:
        return [leaf_of(leaves, leaf_bits(h)) for h in hashes]
    import numpy as np

    bits = (np.fromiter(hashes, np.int64, len(hashes)) >> 32) & 0xFFFFFFFF
    by_depth: dict[int, list[int]] = {}
    for lid in leaves:
        by_depth.setdefault(_depth(lid), []).append(lid)
    out = np.zeros(len(hashes), np.int64)
    open_ = np.ones(len(hashes), bool)
    for depth in sorted(by_depth):
        cand = (bits & ((1 << depth) - 1)) | (1 << depth)
        hit = open_ & np.isin(cand, np.array(by_depth[depth], np.int64))
        out[hit] = cand[hit]
        open_ &= ~hit
    if open_.any():
        bad = int(bits[np.flatnonzero(open_)[0]])
        raise StateSchemaError(f"batched engine: no leaf for hash bits {bad:#x}; the directory is damaged")
    return out.tolist()


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



def open_entry(e: Any) -> Any:
    """A leaf entry (``[cols, timeout, hash]``, or None) with its state columns unpickled in
    place if the leaf holds them as a pickle of their own (layout version 2)."""
    if e is not None and type(e[0]) is bytes:
        e[0] = pickle.loads(e[0])
    return e


#: a leaf whose keys a call ran with input for at least this share of is written whole
INLINE_SHARE = 0.5
#: a leaf stored in fewer bytes a key than this is written whole: a small state (a count, a few
#: numbers) pickles as fast whole as sealed, and a pickle of its own adds about 15 bytes a key
SEAL_MIN_KEY_BYTES = 64


def seal_leaf(entries: dict, changed: int, stored_bytes: int) -> dict:
    """The entries of a leaf as they are written, given how many of its keys a call ran with
    input (``changed``: those keys' state changes as a rule) and the size of the leaf as it was
    stored (0 for a new leaf): every key's columns inline (one pickle of the whole leaf) when
    that is at least :data:`INLINE_SHARE` of the keys or the leaf is small
    (:data:`SEAL_MIN_KEY_BYTES`), else each key's columns as a pickle of their own, so that the
    next call that touches a few of its keys opens only those (measured: a leaf of 48 keys of
    about 100 bytes, one key touched, 15 µs a read and write against 43-48 µs whole; with 37-56
    bytes a key, 15-19 µs either way).

    >>> leaf = {"a": [(1,), None, 7], "b": [pickle.dumps((2,), PICKLE_PROTOCOL), 5, 9], "c": [None, 3, 1]}
    >>> sparse = seal_leaf(dict(leaf), 1, 3 * SEAL_MIN_KEY_BYTES)
    >>> [type(e[0]).__name__ for e in sparse.values()]
    ['bytes', 'bytes', 'NoneType']
    >>> [open_entry(e)[0] for e in seal_leaf(sparse, 2, 3 * SEAL_MIN_KEY_BYTES).values()]
    [(1,), (2,), None]
    >>> [e[0] for e in seal_leaf(dict(leaf), 1, 3 * 40).values()]  # small: whole
    [(1,), (2,), None]
    """
    n = len(entries)
    if changed >= INLINE_SHARE * n or stored_bytes < SEAL_MIN_KEY_BYTES * n:
        for e in [e for e in entries.values() if type(e[0]) is bytes]:
            e[0] = pickle.loads(e[0])
    else:
        for e in [e for e in entries.values() if type(e[0]) is tuple]:
            e[0] = pickle.dumps(e[0], PICKLE_PROTOCOL)
    return entries


def split_rows(leaf_rows: int, ran: int, n: int) -> int:
    """The most keys a leaf of ``n`` keys keeps, unsplit, when a call that ran ``ran`` of them
    writes it: ``leaf_rows``, or half of it when that call ran fewer than :data:`INLINE_SHARE`
    of its keys (the test :func:`seal_leaf` seals by).

    A call that touches few keys of each leaf (small micro-batches over many keys) reads and
    writes every touched leaf whole through Spark's state server, at a cost that follows the
    leaf's bytes: at 1,000 events/s over 50K keys a running count's stateful task took 208 ms
    with leaves of 32 keys against 298 with 64. Batches that touch most keys of their leaves (a
    backlog, large files) pay per leaf instead, and sustained 4-7% more with leaves of 64, which
    they keep (docs/bench/2026-12-07-sparse-leaves.md). Leaves never merge, so a leaf split by a
    sparse call stays at half size.

    >>> split_rows(64, 1, 60), split_rows(64, 30, 60), split_rows(64, 29, 60), split_rows(1, 0, 2)
    (32, 64, 32, 1)
    """
    return leaf_rows if ran >= INLINE_SHARE * n else max(1, leaf_rows // 2)


def min_timeout(entries: dict) -> int | None:
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
    #: the layout version it was stored with (written again as :data:`LAYOUT_VERSION` with the
    #: bucket's next commit, so that an older release refuses a bucket whose leaves it cannot read)
    version: int = LAYOUT_VERSION

    @staticmethod
    def new(buckets: int, fields: tuple[str, ...], key_schema: str, state_schema: str) -> "Directory":
        return Directory(buckets, fields, {1: [0, None]}, None, key_schema, state_schema, True)

    def dumps(self) -> bytes:
        return pickle.dumps((LAYOUT_VERSION, self.buckets, self.fields, self.leaves, self.timer,
                             self.key_schema, self.state_schema), PICKLE_PROTOCOL)

    @staticmethod
    def loads(blob: bytes) -> "Directory":
        version, *rest = pickle.loads(blob)
        if version not in READABLE_VERSIONS:
            raise StateSchemaError(
                f"batched engine: state layout version {version} is not supported (this release reads versions"
                f" {', '.join(map(str, READABLE_VERSIONS))}): the checkpoint was written by a newer sparkstate")
        buckets, fields, leaves, timer, key_schema, state_schema = rest
        return Directory(buckets, tuple(fields), leaves, timer, key_schema, state_schema, version=version)

    def earliest(self) -> int | None:
        return min((m for _, m in self.leaves.values() if m is not None), default=None)

    def stored_leaves(self) -> int:
        """Leaves holding keys (an emptied leaf keeps its entry here, with no blob stored)."""
        return sum(1 for c, _ in self.leaves.values() if c)


#: a call reads its bucket's stored leaves in one scan when it needs at least this many of them
#: and at least half; else it reads them by leaf id, in windows (:class:`.wire.LeafIO`)
SCAN_MIN_LEAVES = 8


def scans(needed: int, stored: int) -> bool:
    """Whether a call that needs ``needed`` of its bucket's ``stored`` leaves (those holding
    keys) reads them in one scan of the bucket rather than leaf by leaf.

    >>> scans(30, 60), scans(29, 60), scans(7, 7), scans(8, 16)
    (True, False, False, True)
    """
    return needed >= SCAN_MIN_LEAVES and needed * 2 >= stored


def keys_to_scan(stored: int) -> float | None:
    """About how many of a bucket's keys a batch touches before it reads the bucket in one scan,
    for keys spread evenly over its ``stored`` leaves (``None``: never, too few leaves).

    >>> keys_to_scan(7), round(keys_to_scan(60)), round(keys_to_scan(8))
    (None, 41, 22)
    """
    import math

    if stored < SCAN_MIN_LEAVES:
        return None
    want = max(SCAN_MIN_LEAVES, math.ceil(stored / 2))
    if want >= stored:  # every leaf: the coupon collector's expected draws
        return stored * sum(1 / i for i in range(1, stored + 1))
    return math.log(1 - want / stored) / math.log(1 - 1 / stored)


def read_plan(dirs: dict[int, "Directory"]) -> dict[str, Any]:
    """How batches read these buckets (``state stats``): leaves and keys, and the batch size from
    which a bucket is read in one scan (:func:`scans`) rather than leaf by leaf."""
    import statistics

    leaves = [d.stored_leaves() for d in dirs.values()]
    total = sum(leaves)
    keys = sum(c for d in dirs.values() for c, _ in d.leaves.values())
    cut = [keys_to_scan(n) for n in leaves]
    scannable = [k for k in cut if k is not None]
    return {
        "buckets": len(dirs),
        "leaves": total,
        "keys_per_leaf": round(keys / total, 1) if total else 0.0,
        "scan_from_keys_per_bucket": round(statistics.median(scannable)) if scannable else None,
        # a batch's keys spread evenly over the buckets: from here the median bucket is scanned
        "scan_from_keys_per_batch": round(statistics.median(scannable) * len(dirs)) if scannable else None,
        "buckets_read_by_key_only": len(cut) - len(scannable),
    }


def build_leaves(entries: dict, max_rows: int) -> dict[int, dict]:
    """The leaves of a bucket holding ``entries`` (key -> [cols, timeout, hash]), from scratch."""
    return split_leaf(1, entries, max_rows)



def stored_layout(spark: Any, checkpoint: str, operator: dict[str, Any]) -> StoredLayout | None:
    """The batched layout of an operator's state (by its state variables), or None."""
    names = operator["state_variables"]
    if DIR_VARIABLE in names and LEAF_VARIABLE in names:
        return LeafLayout(spark, checkpoint, operator)
    return None


class LeafLayout(StoredLayout):
    engine = ENGINE
    version = LAYOUT_VERSION
    #: The latest batch's directories, once read (the checkpoint check reads them twice).
    _latest: "dict[int, Directory] | None" = None

    def _directories(self, batch_id: int | None) -> dict[int, Directory]:
        if batch_id is None and self._latest is not None:
            return self._latest
        rows = self.variable(DIR_VARIABLE, batch_id).collect()
        dirs = {r.key[0]: Directory.loads(r.value.blob) for r in rows}
        if batch_id is None:
            self._latest = dirs  # the checkpoint check reads the schemas, then the bucket count
        return dirs

    def settings(self) -> dict[str, Any]:
        """The bucket count every directory records (fixed when the checkpoint was created)."""
        counts = sorted({d.buckets for d in self._directories(None).values()})
        if len(counts) > 1:
            raise StateSchemaError(f"batched engine: the state's buckets record different counts {counts};"
                                   " the checkpoint is damaged")
        return {"buckets": counts[0]} if counts else {}

    def reads(self) -> dict[str, Any]:
        return read_plan(self._directories(None))

    @staticmethod
    def _schemas(dirs: dict[int, Directory]) -> tuple[StructType, StructType]:
        """The key and state schemas most buckets were last written with (buckets not touched since an
        upgrade still hold the older one; their rows are matched to it by field name)."""
        from collections import Counter

        if not dirs:
            raise StateSchemaError("the checkpoint's state is empty (no key was ever stored)")
        key_json = Counter(d.key_schema for d in dirs.values()).most_common(1)[0][0]
        state_json = Counter(d.state_schema for d in dirs.values()).most_common(1)[0][0]
        return StructType.fromJson(json.loads(key_json)), StructType.fromJson(json.loads(state_json))

    def schema(self) -> tuple[StructType, StructType]:
        return self._schemas(self._directories(None))

    def schemas(self) -> tuple[StructType, list[StructType]]:
        dirs = self._directories(None)
        key, _ = self._schemas(dirs)
        seen = dict.fromkeys(d.state_schema for d in dirs.values())
        return key, [StructType.fromJson(json.loads(j)) for j in seen]

    def records(self, batch_id: int | None) -> "DataFrame":
        from pyspark.sql import functions as F

        dirs = self._directories(batch_id)
        key_schema, state_schema = self._schemas(dirs)
        # every bucket's columns are fitted to the target: a leaf re-laid after a type change still
        # holds the values of keys not called since (an int where the field is now a double)
        bucket_relayers = {b: relayer(StructType.fromJson(json.loads(d.state_schema)), state_schema)
                           for b, d in dirs.items()}
        default_fit = relayer(state_schema, state_schema)
        single = len(key_schema.fields) == 1

        def decode(row: Any) -> Any:
            fit = bucket_relayers.get(row[0], default_fit)
            for k, e in pickle.loads(row[1]).items():
                cols, timeout = open_entry(e)[:2]
                if cols is not None and fit is not None:
                    cols = fit(cols)
                keys = (k,) if single else tuple(k)
                yield (row[2], keys, cols, timeout, cols is not None)

        leaves = self.variable(LEAF_VARIABLE, batch_id).select(
            F.col("key").getField(BUCKET_COLUMN).alias("bucket"), F.col("user_map_value.blob").alias("blob"), "partition_id")
        return decoded_records(leaves, decode, key_schema, state_schema)
