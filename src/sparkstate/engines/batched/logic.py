"""The batched engine running a plan's :class:`~sparkstate.engines.base.BucketLogic`: one call of
the logic per bucket and micro-batch, over the bucket's columns.

Same buckets, directory, leaves, timers, packing and initial state as the per-key loop
(:mod:`.processor`), so a checkpoint written either way goes on the other way. Only the middle
differs: :class:`LogicProcessor` reads the bucket's input as one Arrow table, numbers its keys,
reads their entries and those of the keys whose timeout is due, hands all of it to the logic as a
:class:`~sparkstate.engines.base.BucketCall`, and stores the writes of its
:class:`~sparkstate.engines.base.BucketResult` in the leaves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import BucketCall
from ..row_values import arrow_column_converter
from ..runtime import arrow_type
from .processor import TableProcessor


class LogicProcessor(TableProcessor):
    """transformWithStateInPandas processor of a plan with a bucket logic (grouping key: the bucket)."""

    def init(self, handle: Any) -> None:
        super().init(handle)
        plan = self.plan
        if plan.bucket_logic is None:
            raise TypeError("LogicProcessor runs a plan with a bucket logic (StatePlan.bucket_logic)")
        self.logic = plan.bucket_logic
        self.key_convs = [arrow_column_converter(self.value_schema[k].dataType) for k in plan.key_columns]
        self.values = list(range(self.input.n_values))
        self.no_rows: Any = None

    def _numbered(self, table: Any) -> tuple[dict, list, np.ndarray]:
        """The keys of the rows in first-seen order (key -> position), their hashes, each row's key position."""
        import pyarrow as pa
        import pyarrow.compute as pc

        key_pos = self.input.key_pos
        col = table.column(key_pos[0])
        if len(key_pos) == 1 and (pa.types.is_string(col.type) or pa.types.is_integer(col.type)):
            # numbered by Arrow (codes in first-seen order); only the distinct keys become Python values
            coded = pc.dictionary_encode(col.combine_chunks(), null_encoding="encode")
            pos = coded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            keys = self.key_convs[0](coded.dictionary)
            number = dict(zip(keys, range(len(keys))))
        else:
            cols = [conv(table.column(i)) for i, conv in zip(key_pos, self.key_convs)]
            row_keys = cols[0] if len(cols) == 1 else list(zip(*cols))
            number = {}
            pos = np.fromiter((number.setdefault(k, len(number)) for k in row_keys), np.int64, len(row_keys))
        _, first = np.unique(pos, return_index=True)  # each key's first row (positions are 0..n-1)
        return number, table.column(self.input.hash_pos).to_numpy()[first].tolist(), pos

    def _rows(self, table: Any) -> Any:
        import pyarrow as pa

        rows = table.select(self.values)
        stamps = [i for i, t in enumerate(rows.schema.types) if pa.types.is_timestamp(t) and t.tz not in (None, "UTC")]
        for i in stamps:  # packed input is labelled with the session time zone: the same instants, as UTC
            rows = rows.set_column(i, rows.field(i).name, rows.column(i).cast(pa.timestamp(rows.field(i).type.unit,
                                                                                          tz="UTC")))
        return rows

    def run_table(self, table: Any, tv: Any) -> list:
        pt, wm = self.times(tv)
        now = self.now(pt, wm)
        if table is not None:
            where, hashes, key_index = self._numbered(table)
            rows = self._rows(table)
            self.no_rows = rows.slice(0, 0)
        else:
            where, hashes, key_index = {}, [], np.zeros(0, np.int64)
            rows = self.no_rows if self.no_rows is not None else self._empty_rows()
        keys = list(where)
        store = self.store
        d = store.load_dir()
        lids, due, touched = store.touch(d, hashes, now)
        entries = [touched[lid].get(k) for k, lid in zip(keys, lids)]
        n_input = len(keys)
        for k, h, lid, e in store.timed_out(touched, due, now, where):
            where[k] = len(keys)
            keys.append(k)
            hashes.append(h)
            lids.append(lid)
            entries.append(e)
        out: list = []
        if keys:
            result = self.logic.run(BucketCall(
                keys, rows, key_index, [None if e is None else e[0] for e in entries],
                [None if e is None else e[1] for e in entries], n_input,
                max(wm, 0) if self.plan.has_watermark else -1, pt))
            for k, w in result.writes.items():
                i = where[k]
                if w is None:
                    touched[lids[i]].pop(k, None)
                else:
                    touched[lids[i]][k] = [w[0], w[1], hashes[i]]
            out.extend(f for f in result.frames if len(f))
            if result.rows:
                out.append(self.frame(result.rows, [(i + 1, k) for i, k in enumerate(result.row_keys)]))
        store.commit(d, touched, now)
        return out

    def _empty_rows(self) -> Any:
        import pyarrow as pa

        return pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in self.input.fields]).empty_table()
