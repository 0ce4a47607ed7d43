"""What the inband engine runs on the Python workers: one ``applyInPandasWithState`` call per
bucket, with the bucket's rows and its one state row (:mod:`.layout`) in the same Arrow stream.

The grouping of the input and the per-key loop are the batched engine's
(:class:`~sparkstate.engines.batched.processor.BucketProcessor`), and so is the call of a plan's
bucket logic over the whole bucket (:class:`InBandLogicProcessor`, through
:class:`~sparkstate.engines.batched.logic.LogicCalls`); only where the entries live differs: here
in the bucket's state row, read and written by Spark, in the same format either way. Which keys are due and what
a call leaves of a key are :mod:`sparkstate.engines.rules`, as in the other engines; the
bucket's Spark timeout is its earliest pending key timeout, so that Spark calls the bucket when
a key of it may be due and no input came.
"""

from __future__ import annotations

from typing import Any, Iterator

from ...errors import StateSchemaError
from ...group_state import GroupStateTimeout
from ..batched.grouping import gc_paused
from ..batched.logic import LogicCalls
from ..batched.processor import BucketProcessor
from ..call_context import wall_clock_ms
from ..rules import due_keys
from ..state_fields import relay
from .layout import Bucket
from .seeds import seed_entries, split_seeds


class _Clock:
    """The batch's clocks, as :meth:`~sparkstate.engines.call_context.Calls.times` reads them."""

    __slots__ = ("pt", "wm")

    def __init__(self, pt: int, wm: int) -> None:
        self.pt, self.wm = pt, wm

    def getCurrentProcessingTimeInMs(self) -> int:
        return self.pt

    def getCurrentWatermarkInMs(self) -> int:
        return self.wm


def _plain_frame_maker(st: Any) -> Any:
    """Encoded output columns -> a pandas DataFrame of plain (object) columns: PySpark
    concatenates applyInPandasWithState's outputs with padding rows, which Arrow-backed columns
    do not survive. Object columns keep a long with a null a long."""
    import pandas as pd

    names = list(st.names)

    def make(cols: list[list]) -> Any:
        return pd.DataFrame({n: pd.Series(c, dtype=object) for n, c in zip(names, cols)}, columns=names)

    return make


class InBandProcessor(BucketProcessor):
    """The function ``applyInPandasWithState`` calls per bucket (grouping key: the bucket); for a
    static DataFrame, ``applyInPandas`` calls :meth:`static` per bucket, with no stored state.

    ``seeded``: the query has an initial state (:mod:`.seeds`), so its input carries the seed
    column last (see :meth:`seed`)."""

    seeded = False

    def _ready(self) -> None:
        if not getattr(self, "_prepared", False):
            self.prepare()
            self.output_frame = _plain_frame_maker(self.plan.output_schema)
            self.fields = tuple(self.plan.state_codec.fields)
            self.state_json = self.plan.state_codec.columns.json()
            self.timers = self.mode != "None"
            self._prepared = True

    def __call__(self, key: tuple, frames: Iterator[Any], gstate: Any) -> Iterator[Any]:
        self._ready()
        with gc_paused():
            out = self._bucket(self.seed(frames, gstate) if self.seeded else frames, gstate)
        if out is not None:
            yield out

    def static(self, frame: Any) -> Any:
        """One bucket of a static DataFrame: every key called once with its rows, from no state."""
        self._ready()
        with gc_paused():
            pt = wall_clock_ms()
            frames, entries = self.static_seed(frame, pt)
            groups, hashes = self.input.group(iter(frames))
            out: list = []
            owners: list = []
            state = self.group_state(None, False, pt, -1, False)
            self.run_keys([(entries, k, hashes[k], rows) for k, rows in groups.items()], False, state, out, owners)
            return self.frame(out, owners) if out else self.output_frame([[] for _ in self.plan.output_schema.names])

    def seed(self, frames: Iterator[Any], gstate: Any) -> Iterator[Any]:
        """The bucket's input without its seed rows; a bucket with no stored row that got its
        seed (the query's first batch) is stored from it first, so the call reads it as its state.
        A seeded bucket keeps a row from then on (:meth:`_store`), so it is never seeded again."""
        rows, seeds = split_seeds(frames)
        if seeds and not gstate.exists:
            pt, _ = self.times(self._clock(gstate))
            b = Bucket(self.buckets, self.fields, self.key_schema, self.state_json, seed_entries(seeds, self.plan, pt))
            gstate.update((b.dumps(),))
        return iter(rows)

    def static_seed(self, frame: Any, pt: int) -> tuple[list, dict]:
        """A static bucket's input without its seed rows, and its entries from the seed."""
        if not self.seeded:
            return [frame], {}
        rows, seeds = split_seeds(iter([frame]))
        return rows, seed_entries(seeds, self.plan, pt)

    def _clock(self, gstate: Any) -> _Clock:
        pt = gstate.getCurrentProcessingTimeMs()
        wm = gstate.getCurrentWatermarkMs() if self.plan.has_watermark else -1
        return _Clock(pt, wm)

    def _load(self, gstate: Any) -> tuple[Bucket, bytes | None]:
        if not gstate.exists:
            return Bucket(self.buckets, self.fields, self.key_schema, self.state_json, {}), None
        blob = gstate.get[0]
        b = Bucket.loads(blob)
        if b.buckets != self.buckets:
            raise StateSchemaError(
                f"{self.plan.operator}: this checkpoint's state was written with {b.buckets} buckets, the query now"
                f" asks for {self.buckets}. Use the same number, or move the state with ss.state.export and a new"
                " checkpoint.")
        if b.fields != self.fields:
            idx = relay(b.fields, self.fields)
            for e in b.entries.values():
                if e[0] is not None:
                    e[0] = tuple(None if i is None else e[0][i] for i in idx)
            b.fields = self.fields
        b.key_schema, b.state_schema = self.key_schema, self.state_json
        return b, blob

    def _bucket(self, frames: Iterator[Any], gstate: Any) -> Any:
        pt, wm = self.times(self._clock(gstate))
        now = self.now(pt, wm)
        b, before = self._load(gstate)
        entries = b.entries
        groups, hashes = self.input.group(frames)
        out: list = []
        owners: list = []
        state = self.group_state(None, False, pt, wm, False)
        self.run_keys([(entries, k, hashes[k], rows) for k, rows in groups.items()], False, state, out, owners)
        if self.timers:
            pending = ((k, e[1], e[2]) for k, e in list(entries.items()))
            expired = [(entries, k, h, ()) for k, h in due_keys(pending, now, groups)]
            if expired:
                self.run_keys(expired, True, state, out, owners)
        self._store(gstate, b, before, pt, now)
        return self.frame(out, owners) if out else None

    def _store(self, gstate: Any, b: Bucket, before: bytes | None, pt: int, now: int) -> None:
        """Write the bucket's row back if it changed and set the bucket's Spark timeout to its
        earliest pending key timeout (Spark clears a group's timeout at every call)."""
        if not b.entries and not self.seeded:  # a seeded bucket keeps its row (see seed)
            if before is not None:
                gstate.remove()
            return
        blob = b.dumps()
        if blob != before:
            gstate.update((blob,))
        if not self.timers:
            return
        m = b.earliest()
        if m is None:
            return
        if self.plan.timeout is GroupStateTimeout.ProcessingTimeTimeout:
            # Spark's group timeout is due once the batch time is past it, as a key's: the same
            # instant; a timeout not after this batch's time fires in the next batch (1 ms on).
            gstate.setTimeoutDuration(max(m - pt, 1))
        else:
            gstate.setTimeoutTimestamp(max(m, now, 1))


class InBandLogicProcessor(InBandProcessor, LogicCalls):
    """:class:`InBandProcessor` for a plan with a bucket logic (``StatePlan.bucket_logic``): each
    call runs the logic once over the bucket (its input as one Arrow table, its stored entries,
    its keys whose timeout is due), as the batched engine's
    :class:`~sparkstate.engines.batched.logic.LogicProcessor` does; the bucket's row holds the
    same entries as the per-key path's. A static DataFrame still runs the plan's function per key."""

    #: The bucket's entries as the one leaf :meth:`LogicCalls.run_logic` reads and writes.
    LEAF = 0

    def _ready(self) -> None:
        if not getattr(self, "_prepared", False):
            super()._ready()
            self.prepare_logic()

    def __call__(self, key: tuple, frames: Iterator[Any], gstate: Any) -> Iterator[Any]:
        self._ready()
        with gc_paused():
            out = self._logic_bucket(self.seed(frames, gstate) if self.seeded else frames, gstate)
        yield from out

    def _logic_bucket(self, frames: Iterator[Any], gstate: Any) -> list:
        pt, wm = self.times(self._clock(gstate))
        now = self.now(pt, wm)
        b, before = self._load(gstate)
        inp = self.logic_input(self.input.table(frames))
        leaf = self.LEAF
        out = self.run_logic(inp, [leaf] * len(inp.hashes), [leaf] if self.timers else [], {leaf: b.entries},
                             pt, wm, now)
        self._store(gstate, b, before, pt, now)
        return out
