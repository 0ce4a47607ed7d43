"""A plan's :class:`~sparkstate.engines.base.BucketLogic` run over a bucket at a time, on either
engine that groups keys into buckets: one call of the logic per bucket and micro-batch, over the
bucket's columns.

:class:`LogicCalls` is the part both engines share: it reads the bucket's input as one Arrow
table, numbers its keys, looks up their entries and those of the keys whose timeout is due in the
entries the engine hands it (leaves of ``key -> [state columns, timeout, key hash]``), hands all
of it to the logic as a :class:`~sparkstate.engines.base.BucketCall`, and applies the writes of
its :class:`~sparkstate.engines.base.BucketResult` to those entries. Where the entries live is
the engine's: :class:`LogicProcessor` here (the batched engine: the bucket's directory and
leaves, timers, packing and initial state as in the per-key loop of :mod:`.processor`), and
:class:`~sparkstate.engines.inband.processor.InBandLogicProcessor` (the bucket's one state row).
Entries are those of the per-key loop, so a checkpoint written either way goes on the other way.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from pyspark.sql.types import StructType

from ..base import BucketCall, StatePlan
from ..row_values import arrow_column_converter
from ..runtime import arrow_type
from .bucket_store import BucketStore
from .grouping import Grouper
from .layout import open_entry
from .processor import TableProcessor


class LogicInput:
    """One call's input, numbered: ``where`` (key -> position, first-seen order), each key's
    ``hashes``, each row's ``key_index``, the ``rows`` the logic sees."""

    __slots__ = ("where", "hashes", "key_index", "rows")

    def __init__(self, where: dict, hashes: list, key_index: np.ndarray, rows: Any) -> None:
        self.where, self.hashes, self.key_index, self.rows = where, hashes, key_index, rows


class LogicCalls:
    """What a processor running a plan's bucket logic does around the call, whatever stores the
    entries (see the module doc). Needs the processor's ``plan``, ``value_schema``, ``input`` (a
    :class:`~.grouping.Grouper`) and ``frame`` (the encoder of output rows)."""

    plan: StatePlan
    value_schema: StructType
    input: Grouper
    frame: Callable[[list, list], Any]

    def prepare_logic(self) -> None:
        plan = self.plan
        if plan.bucket_logic is None:
            raise TypeError(f"{type(self).__name__} runs a plan with a bucket logic (StatePlan.bucket_logic)")
        self.logic = plan.bucket_logic
        self.key_convs = [arrow_column_converter(self.value_schema[k].dataType) for k in plan.key_columns]
        self.values = list(range(self.input.n_values))
        self.no_rows: Any = None

    def logic_input(self, table: Any) -> LogicInput:
        """The bucket's input (an Arrow table from :meth:`.grouping.Grouper.table`, or ``None``
        on a call with no rows), numbered."""
        if table is None:
            rows = self.no_rows if self.no_rows is not None else self._empty_rows()
            return LogicInput({}, [], np.zeros(0, np.int64), rows)
        where, hashes, key_index = self._numbered(table)
        rows = self._rows(table)
        self.no_rows = rows.slice(0, 0)
        return LogicInput(where, hashes, key_index, rows)

    def run_logic(self, inp: LogicInput, lids: list, due: list, touched: dict[Any, dict], pt: int, wm: int,
                  now: int) -> list:
        """Call the logic for the input's keys (``lids``: the leaf of ``touched`` each one's entry is
        in) and the keys of the ``due`` leaves whose timeout is due at ``now``; apply its writes to
        ``touched`` in place; return the output frames."""
        where = dict(inp.where)
        keys = list(where)
        hashes = list(inp.hashes)
        lids = list(lids)
        entries = [open_entry(touched[lid].get(k)) for k, lid in zip(keys, lids)]
        n_input = len(keys)
        for k, h, lid, e in BucketStore.timed_out(touched, due, now, where):
            where[k] = len(keys)
            keys.append(k)
            hashes.append(h)
            lids.append(lid)
            entries.append(e)
        out: list = []
        if not keys:
            return out
        result = self.logic.run(BucketCall(
            keys, inp.rows, inp.key_index, [None if e is None else e[0] for e in entries],
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
        return out

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

    def _empty_rows(self) -> Any:
        import pyarrow as pa

        return pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in self.input.fields]).empty_table()


class LogicProcessor(TableProcessor, LogicCalls):
    """transformWithStateInPandas processor of a plan with a bucket logic (grouping key: the
    bucket); the entries are the bucket's leaves (:class:`.bucket_store.BucketStore`)."""

    def init(self, handle: Any) -> None:
        super().init(handle)
        self.prepare_logic()

    def run_table(self, table: Any, tv: Any) -> list:
        pt, wm = self.times(tv)
        now = self.now(pt, wm)
        inp = self.logic_input(table)
        store = self.store
        d = store.load_dir()
        lids, due, touched = store.touch(d, inp.hashes, now)
        out = self.run_logic(inp, lids, due, touched, pt, wm, now)
        store.commit(d, touched, now)
        return out
