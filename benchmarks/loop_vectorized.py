"""``python -m benchmarks.loop_vectorized``: ``map_batches_with_state``'s processor on one bucket,
without Spark, beside the batched engine's per-key processor on the same input.

Both processors (``VectorProcessor`` with ``benchmarks.contenders.count_per_batch``, ``BucketProcessor``
with ``count_per_key``) get the packed running-count batches of :mod:`benchmarks.loop` (every key
of the bucket touched in every batch) through the in-memory state variables of that module, as
``transformWithStateInPandas`` calls them for one bucket. Reported: this thread's CPU time per key
and batch (batch 0, which creates every key, left out), median of ``repeats`` fresh passes. Every
batch's outputs of the two processors are compared: a difference is an error.

>>> r = run(keys=300, batches=2, events_per_key=2, repeats=1)
>>> r["checked"], r["per_key_us"]["vectorized"] > 0, r["per_key_us"]["batched"] > 0
(True, True, True)
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Callable

from pyspark.sql.types import LongType, StructField, StructType

from sparkstate.engines.batched.layout import HASH_COLUMN
from sparkstate.engines.batched.grouping import gc_paused
from sparkstate.engines.batched.vectorized import VectorProcessor

from . import loop
from .contenders import count_per_batch


def _batched() -> tuple[Callable[[], Any], Callable[[Any, Any], Any]]:
    plan, _ = loop.plan_for("count")

    def call(proc: Any, b: Any) -> Any:
        with gc_paused():
            groups, hashes = proc.input.group(iter(b.frames))
            return proc.process(groups, hashes, loop.Times(b.pt, b.wm))
    return lambda: loop.processor_for("count", plan), call


def _vectorized() -> tuple[Callable[[], Any], Callable[[Any, Any], Any]]:
    plan, _ = loop.plan_for("count")
    plan = replace(plan, func=count_per_batch, operator="map_batches_with_state")
    schema = StructType(loop.COUNT_INPUT.fields + [StructField(HASH_COLUMN, LongType(), True)])

    def make() -> Any:
        proc = VectorProcessor(plan, loop.BUCKETS, loop.LEAF_ROWS, schema)
        proc.init(loop.Handle())
        return proc
    return make, lambda proc, b: list(proc.handleInputRows((0,), iter(b.frames), loop.Times(b.pt, b.wm)))


def _rows(frames: Any) -> list:
    return sorted(tuple(r) for f in frames for r in f.itertuples(index=False))


def run(keys: int = 25_000, batches: int = 5, events_per_key: int = 5, repeats: int = 3) -> dict:
    data = loop.make_batches("count", keys, batches, events_per_key)
    per_key, outputs = loop.side_by_side(data, {"batched": _batched(), "vectorized": _vectorized()}, keys, repeats,
                                         _rows, pick=statistics.mean)
    if outputs["batched"] != outputs["vectorized"]:
        raise AssertionError("the vectorized processor's outputs differ from the per-key processor's")
    return {"keys": keys, "batches": batches, "events_per_key": events_per_key, "per_key_us": per_key,
            "checked": True, "load": list(loop._load())}


def main(argv: list[str] | None = None) -> int:
    a = loop.side_by_side_args("python -m benchmarks.loop_vectorized", __doc__, argv)
    r = run(a.keys, a.batches, a.events_per_key, a.repeats)
    print(f"{r['keys']} keys in the bucket, {r['events_per_key']} events/key/batch, CPU us per key and batch:"
          f" batched {r['per_key_us']['batched']}, vectorized {r['per_key_us']['vectorized']}"
          f" (outputs equal; load {r['load']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
