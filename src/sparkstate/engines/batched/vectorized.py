"""The batched engine for ``map_batches_with_state``: one call of the user's function per bucket and
micro-batch, with the bucket's rows and states as pandas columns.

Same buckets, directory, leaves, timers, packing and initial state as the per-key processor
(:mod:`.processor`, layout :mod:`.layout`), so checkpoints, restarts and the state tools work
unchanged. Only the middle differs: instead of grouping the input into per-key ``Row`` lists and
calling the function per key, :class:`VectorProcessor` sorts the bucket's Arrow input by key,
converts it to one pandas frame, gathers the keys' leaf entries into ``batch.state`` and writes
back what the function's :class:`~sparkstate.StateUpdate` says
(:class:`~sparkstate.engines.batch_rules.BatchRules`: the rules, shared with the no-Spark harness).
"""

from __future__ import annotations

from typing import Any

from ..batch_rules import NO_ENTRY, BatchRules
from ..runtime import arrow_type
from .engine import BatchedEngine
from .grouping import key_cuts
from .layout import open_entry
from .processor import TableProcessor


class VectorProcessor(TableProcessor):
    """transformWithStateInPandas processor of ``map_batches_with_state`` (grouping key: the bucket)."""

    def init(self, handle: Any) -> None:
        super().init(handle)
        plan = self.plan
        fields = self.value_schema.fields
        self.rules = BatchRules(plan.operator, plan.func, plan.key_columns,
                                [self.value_schema[k].dataType for k in plan.key_columns],
                                plan.state_codec, plan.timeout, plan.output_schema)
        self.arrow_types = [arrow_type(f.dataType) for f in fields[: self.input.n_values]]

    def _runs(self, table: Any) -> tuple[Any, list, list, Any, Any]:
        """The table with each key's rows together (arrival order kept), its keys in run order,
        their hashes, each row's key position, and the keys as Arrow arrays (or None)."""
        import numpy as np

        key_pos = self.input.key_pos
        h = table.column(self.input.hash_pos).to_numpy()
        order = np.argsort(h, kind="stable")
        h = h[order]
        table = table.take(order)
        cuts = np.flatnonzero(h[1:] != h[:-1]) + 1
        if key_cuts(table, key_pos, len(h)).tolist() == cuts.tolist():
            starts = np.concatenate(([0], cuts)).astype(np.int64)
            heads = table.take(starts)
            keys = self._keys(heads)
            index = np.repeat(np.arange(len(starts), dtype=np.int64), np.diff(np.append(starts, len(h))))
            arrays = [heads.column(i).combine_chunks() for i in key_pos]
            return table, keys, h[starts].tolist(), index, arrays
        # null keys, or two keys sharing a hash: group by the keys themselves, first seen first
        all_keys = self._keys(table)
        ids: dict = {}
        gid = np.fromiter((ids.setdefault(k, len(ids)) for k in all_keys), np.int64, len(all_keys))
        order = np.argsort(gid, kind="stable")
        table = table.take(order)
        sorted_ids = gid[order]
        first = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
        hs = h[order]
        return table, [all_keys[i] for i in order[first]], hs[first].tolist(), sorted_ids, None

    def _keys(self, table: Any) -> list:
        cols = [conv(table.column(i)) for i, conv in zip(self.input.key_pos, self.rules.key_convs)]
        return cols[0] if len(cols) == 1 else list(zip(*cols))

    # -- one call -----------------------------------------------------------------------------
    def run_table(self, table: Any, tv: Any) -> list:
        pt, wm = self.times(tv)
        now = self.now(pt, wm)
        store = self.store
        d = store.load_dir()
        index = arrays = None
        if table is not None:
            table, keys, hashes, index, arrays = self._runs(table)
        else:
            keys, hashes = [], []
        lids, due, touched = store.touch(d, hashes, now)
        entries = [open_entry(touched[lid].get(k, NO_ENTRY)) for k, lid in zip(keys, lids)]
        n_input = len(keys)
        for k, h, lid, e in store.timed_out(touched, due, now, set(keys)):
            keys.append(k)
            hashes.append(h)
            lids.append(lid)
            entries.append(e)
        out: list = []
        if keys:
            out = self._call_batch(table, keys, hashes, lids, entries, n_input, touched, pt, wm, index, arrays)
        store.commit(d, touched, now)
        return out

    def _call_batch(self, table: Any, keys: list, hashes: list, lids: list, entries: list, n_input: int,
                    touched: dict, pt: int, wm: int, index: Any, arrays: Any) -> list:
        import numpy as np

        if table is None:
            rows, index = self._empty_rows(), np.zeros(0, np.int64)
        else:
            rows = table.select(range(self.input.n_values)).to_pandas()
        where = dict(zip(keys, range(len(keys))))
        output, writes = self.rules.call(rows, keys, entries, n_input, pt, wm, self.plan.has_watermark, index, arrays,
                                         where)
        for k, w in writes.items():
            i = where[k]
            if w is None:
                touched[lids[i]].pop(k, None)
            else:
                touched[lids[i]][k] = [w[0], w[1], hashes[i]]
        return [output] if output is not None and len(output) else []

    def _empty_rows(self) -> Any:
        import pyarrow as pa

        schema = pa.schema([pa.field(n, t) for n, t in zip(self.input.value_names, self.arrow_types)])
        return schema.empty_table().to_pandas()


class VectorizedEngine(BatchedEngine):
    """The batched engine running a ``map_batches_with_state`` function (same layout and options)."""

    processor_class = VectorProcessor
