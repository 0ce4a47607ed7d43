"""``python -m benchmarks.loop_sessions``: event-time sessionize on one bucket, without Spark: the
columnar sessionizer (``SessionLogic``, which the batched engine runs for it through its
``LogicProcessor``) beside the per-key loop (``BucketProcessor`` calling ``Sessionizer`` per key) on
the same input; and the same two on the inband engine (``InBandLogicProcessor``,
``InBandProcessor``: the bucket's entries in one pickled state row, read and written whole each
call, through PySpark's own ``GroupState``).

Both get the sessions batches of :mod:`benchmarks.loop` (every key of the bucket touched in every
batch, unpacked pandas rows as an event-time input arrives) through that module's in-memory
state variables. Reported: this thread's CPU time per key and batch, including the cyclic
collection the call's objects set off once it returns (batch 0, which creates every key, left
out), median of ``repeats`` fresh passes. Every batch's outputs of the two processors are
compared: a difference is an error.

>>> r = run(keys=300, batches=2, events_per_key=2, repeats=1)
>>> r["checked"], r["per_key_us"]["columnar"] > 0, r["per_key_us"]["inband per-key"] > 0
(True, True, True)
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from sparkstate.engines.batched.layout import BUCKET_COLUMN, HASH_COLUMN
from sparkstate.engines.batched.logic import LogicProcessor
from sparkstate.engines.batched.processor import BucketProcessor
from sparkstate.engines.inband.layout import STATE_SCHEMA
from sparkstate.engines.inband.processor import InBandLogicProcessor, InBandProcessor

from . import loop


def _processor(cls: type) -> Any:
    plan, _ = loop.plan_for("sessions")
    schema = StructType(loop.SESSIONS_INPUT.fields + [StructField(HASH_COLUMN, LongType(), True),
                                                      StructField(BUCKET_COLUMN, IntegerType(), True)])
    proc = cls(plan, loop.BUCKETS, loop.LEAF_ROWS, schema, packed=False, tz="UTC")
    proc.init(loop.Handle())
    return proc


class _InBandBucket:
    """An inband processor and the bucket's state row, as applyInPandasWithState keeps it."""

    def __init__(self, cls: type) -> None:
        plan, _ = loop.plan_for("sessions")
        schema = StructType(loop.SESSIONS_INPUT.fields + [StructField(HASH_COLUMN, LongType(), True),
                                                          StructField(BUCKET_COLUMN, IntegerType(), True)])
        self.proc = cls(plan, loop.BUCKETS, 1, schema, packed=False, tz="UTC")
        self.blob: bytes | None = None


def _inband_call(bucket: _InBandBucket, b: Any) -> list:
    from pyspark.sql import Row
    from pyspark.sql.streaming.state import GroupState

    gs = GroupState(None if bucket.blob is None else Row(bucket.blob), b.pt, b.wm, "EventTimeTimeout", False, True,
                    bucket.blob is not None, False, False, -1, b"", STATE_SCHEMA)
    out = list(bucket.proc((0,), iter(b.frames), gs))
    bucket.blob = gs.getOption[0] if gs.exists else None
    return out


def _rows(frames: list) -> list:
    out = []
    for f in frames:
        for r in f.itertuples(index=False):
            out.append((r[0], pd.Timestamp(r[1]).value, pd.Timestamp(r[2]).value, int(r[3]), tuple(r[4]), r[5]))
    return sorted(out)


def _call(proc: Any, b: Any) -> list:
    return list(proc.handleInputRows((0,), iter(b.frames), loop.Times(b.pt, b.wm)))


def run(keys: int = 25_000, batches: int = 5, events_per_key: int = 5, repeats: int = 3) -> dict:
    data = loop.make_batches("sessions", keys, batches, events_per_key)
    contenders = {name: (lambda cls=cls: _processor(cls), _call)
                  for name, cls in (("columnar", LogicProcessor), ("per-key", BucketProcessor))}
    contenders.update({name: (lambda cls=cls: _InBandBucket(cls), _inband_call)
                       for name, cls in (("inband columnar", InBandLogicProcessor),
                                         ("inband per-key", InBandProcessor))})
    per_key, outputs = loop.side_by_side(data, contenders, keys, repeats, _rows)
    if any(outputs[name] != outputs["per-key"] for name in contenders):
        raise AssertionError("the columnar sessionizer's outputs differ from the per-key loop's")
    return {"keys": keys, "batches": batches, "events_per_key": events_per_key, "per_key_us": per_key,
            "sessions": sum(len(o) for o in outputs["columnar"]), "checked": True, "load": list(loop._load())}


def main(argv: list[str] | None = None) -> int:
    a = loop.side_by_side_args("python -m benchmarks.loop_sessions", __doc__, argv)
    r = run(a.keys, a.batches, a.events_per_key, a.repeats)
    print(f"{r['keys']} keys in the bucket, {r['events_per_key']} events/key/batch, CPU us per key and batch:"
          f" columnar {r['per_key_us']['columnar']}, per-key {r['per_key_us']['per-key']};"
          f" inband: columnar {r['per_key_us']['inband columnar']}, per-key {r['per_key_us']['inband per-key']}"
          f" ({r['sessions']} sessions, outputs equal; load {r['load']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
