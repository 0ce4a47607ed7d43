"""A bucket's input, grouped by key: what the batched engine's processors get from Spark, turned
into each key's rows (:meth:`Grouper.group`, for the per-key loop) or into one Arrow table with a
key's rows together (:meth:`Grouper.table`, :func:`key_cuts`, for the vectorized call).

The input comes packed (:mod:`.packing`: Arrow IPC blobs holding the input's columns and the key
hash) or, for an event-time query, row by row as pandas chunks with the hash and the bucket
appended (see :mod:`.engine`).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from functools import partial, reduce
from typing import Any, Iterator

import numpy as np
from pyspark.sql.types import StructType

from ...types import row_class
from ..base import StatePlan
from ..row_values import arrow_column_converter
from .layout import HASH_COLUMN


@contextmanager
def gc_paused() -> Iterator[None]:
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


def key_cuts(table: Any, key_pos: list[int], n: int) -> Any:
    """Positions where the key changes from the row before (a null key counts as a change)."""
    import numpy as np
    import pyarrow.compute as pc

    if n < 2:
        return np.zeros(0, np.int64)
    cols = [table.column(i) for i in key_pos]
    changed = reduce(pc.or_, [pc.fill_null(pc.not_equal(c.slice(1), c.slice(0, n - 1)), True) for c in cols])
    return np.flatnonzero(changed.to_numpy(zero_copy_only=False)) + 1


def group_by_key(groups: dict, hashes: dict, keys: Any, key_hashes: Any, rows: Any) -> None:
    """Add rows to their key's list, one dict step per row."""
    for k, h, r in zip(keys, key_hashes, rows):
        g = groups.get(k)
        if g is None:
            groups[k] = [r]
            hashes[k] = h
        else:
            g.append(r)


class Grouper:
    """How to read one query's bucket input.

    ``value_schema``: the input's columns, then the key hash (packed), or then the hash and the
    bucket (row by row). ``tz``: the session time zone PySpark converted timestamps with (row
    by row only).
    """

    def __init__(self, plan: StatePlan, value_schema: StructType, packed: bool = True, tz: str = "UTC") -> None:
        names = list(value_schema.names)
        self.packed = packed
        self.n_values = len(names) - (1 if packed else 2)
        self.value_names = names[: self.n_values]
        self.key_pos = [names.index(k) for k in plan.key_columns]
        self.hash_pos = names.index(HASH_COLUMN)
        self.decode_value = plan.value_decoder
        fields = value_schema.fields[: self.n_values]
        self.fields = fields
        self.zone = None
        if packed:
            self.converters = [arrow_column_converter(f.dataType) for f in fields]
        else:
            from .pandas_values import pandas_column_converter, zone

            self.zone = zone(tz)
            self.converters = [pandas_column_converter(f.dataType, self.zone) for f in fields]

    def table(self, frames: Iterator[Any]) -> Any:
        """The bucket's input as one Arrow table (the input's columns in Spark's Arrow types, timestamps
        as UTC instants, then the key hash), rows in arrival order; None when there are none."""
        import pyarrow as pa

        if self.packed:
            tables = self.packed_tables(frames)
        else:
            # row by row (see engine.py): back to Arrow, undoing PySpark's pandas conversion
            from .pandas_values import arrow_column

            assert self.zone is not None, "set with the converters of unpacked input"
            tables = [pa.table([arrow_column(pdf.iloc[:, i], f.dataType, self.zone, conv)
                                for i, (f, conv) in enumerate(zip(self.fields, self.converters))]
                               + [pa.array(pdf.iloc[:, self.hash_pos].to_numpy(np.int64))],
                               names=self.value_names + [HASH_COLUMN])
                      for pdf in frames if len(pdf)]
        if not tables:
            return None
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def packed_tables(self, frames: Iterator[Any]) -> list:
        """The non-empty Arrow tables inside packed input."""
        import pyarrow as pa

        # an empty blob marks a bucket to call with no rows (packing.packer's every_bucket)
        tables = [pa.ipc.open_stream(blob).read_all() for pdf in frames for blob in pdf.iloc[:, 1].tolist() if blob]
        return [t for t in tables if t.num_rows]

    def group(self, frames: Iterator[Any]) -> tuple[dict, dict]:
        """The bucket's input -> key -> [values] (as the function sees them), key -> hash."""
        if not self.packed:
            return self._group_rows(frames)
        import numpy as np
        import pyarrow as pa

        groups: dict = {}
        hashes: dict = {}
        tables = self.packed_tables(frames)
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
        if key_cuts(table, self.key_pos, len(h)).tolist() == cuts.tolist():
            # one run per key: no two keys share a hash, no null key
            bounds = [0, *cuts.tolist(), len(h)]
            for s, e in zip(bounds, bounds[1:]):
                k = keys[s]
                groups[k] = rows[s:e]
                hashes[k] = hashes_at[s]
            return groups, hashes
        group_by_key(groups, hashes, keys, hashes_at, rows)  # null keys, or two keys with one hash
        return groups, hashes

    def _group_rows(self, frames: Iterator[Any]) -> tuple[dict, dict]:
        """Unpacked input (pandas chunks of rows) -> key -> [values], key -> hash."""
        groups: dict = {}
        hashes: dict = {}
        for pdf in frames:
            if len(pdf) == 0:
                continue
            keys, rows = self._keys_and_rows([conv(pdf.iloc[:, i]) for i, conv in enumerate(self.converters)])
            group_by_key(groups, hashes, keys, pdf.iloc[:, self.hash_pos].tolist(), rows)
        return groups, hashes

    def _keys_and_rows(self, cols: list[list]) -> tuple[list, list]:
        """Converted input columns -> the key of each row, and each row as the function sees it."""
        kp = self.key_pos
        keys = cols[kp[0]] if len(kp) == 1 else list(zip(*(cols[i] for i in kp)))
        values = zip(*cols) if self.n_values > 1 else ((v,) for v in cols[0])
        decode = self.decode_value
        make = partial(tuple.__new__, row_class(self.value_names)) if decode is None else decode
        return keys, list(map(make, values))
