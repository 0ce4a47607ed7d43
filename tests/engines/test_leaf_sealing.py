"""Sealed leaves (the batched engine's layout version 2), without Spark: a leaf that a call ran
with input for few of its keys is written with each key's state columns as a pickle of their own
and opened key by key; a leaf most of whose keys had input is written whole, as version 1 wrote
every leaf. Asserted: the same outputs and the same state as leaves always written whole, batch
after batch in shuffled orders, for the per-key loop and the columnar sessionizer; a version 1
bucket goes on under version 2; a version this release does not know is refused in a sentence.
Through Spark: tests/engines/test_batched.py (a list state's batch that touches two keys of 1,000)."""

from __future__ import annotations

import pickle
import random
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from benchmarks.loop import Handle, Times, key_hashes
from sparkstate.engines.batched import bucket_store, layout
from sparkstate.engines.batched.layout import BUCKET_COLUMN, DIR_VARIABLE, HASH_COLUMN, LEAF_VARIABLE, Directory
from sparkstate.engines.batched.logic import LogicProcessor
from sparkstate.engines.batched.processor import BucketProcessor
from sparkstate.errors import StateSchemaError
from tests.pipelines.test_columnar_sessionizer import GAP_MS, T0, canon, plan_for, schema_for

KEYS = [f"user-{i:03d}" for i in range(300)]
HASH = dict(zip(KEYS, key_hashes(len(KEYS)).tolist()))
#: a batch's span of event time, well inside the session gap: keys stay in state batch after batch
STEP = 2_000
PLAN, INPUTS = plan_for(emit=False, carry=0, time_column=False, emit_on_last=False)
SCHEMA = schema_for(INPUTS, False)


def frame(rows: list[tuple]) -> pd.DataFrame:
    """``(key, event ms, data, is_last)`` rows as PySpark hands them to the processor."""
    return pd.DataFrame({
        "user_id": [r[0] for r in rows],
        "event_time": pd.to_datetime(pd.Series([r[1] for r in rows], dtype="int64"), unit="ms"),
        "data": pd.Series([r[2] for r in rows], dtype=object),
        "is_last": np.array([r[3] for r in rows], bool),
        HASH_COLUMN: np.array([HASH[r[0]] for r in rows], np.int64),
        BUCKET_COLUMN: np.zeros(len(rows), np.int32),
    })


def batches(rng: random.Random, n: int) -> list[list[tuple]]:
    """Batches touching a few keys (sparse leaves) or most keys (whole leaves), or none (a timer
    call), shuffled; batch ``b``'s events are 3 s early to 1 s late against ``T0 + b * STEP``."""
    out = []
    for b in range(n):
        kind = rng.choice(["few", "few", "most", "none"])
        keys = [] if kind == "none" else rng.sample(KEYS, 3 if kind == "few" else 250)
        base = T0 + b * STEP
        rows = [(k, base + rng.randint(-3_000, 1_000), f"/p{rng.randint(0, 9)}", rng.random() < 0.1)
                for k in keys for _ in range(rng.randint(1, 2))]
        rng.shuffle(rows)
        out.append(rows)
    return out


def call(p, rows: list[tuple], b: int, wm: int) -> list:
    if rows:
        return canon(list(p.handleInputRows((0,), iter([frame(rows)]), Times(b, wm))))
    return canon(list(p.handleExpiredTimer((0,), Times(b, wm), None)))


def opened(handle: Handle) -> dict:
    """Every key's entry, its state columns unpickled whichever way the leaf holds them."""
    out = {}
    for (_lid,), (blob,) in handle.maps[LEAF_VARIABLE].data.items():
        for k, e in pickle.loads(blob).items():
            out[k] = list(layout.open_entry(e))
    return out


def forms(handle: Handle) -> Counter:
    return Counter(type(e[0]).__name__ for (_l,), (blob,) in handle.maps[LEAF_VARIABLE].data.items()
                   for e in pickle.loads(blob).values())


def run(cls, rows_by_batch: list[list[tuple]], handle: Handle | None = None, start: int = 0,
        flush: bool = True) -> tuple[list, Handle]:
    """The batches (``start`` numbers the first) through a processor, batch ``b`` at the
    watermark its events keep ahead of (:func:`batches`), then, with ``flush``, a timer call past
    every session."""
    p = cls(PLAN, 64, 64, SCHEMA, packed=False, tz="UTC")
    handle = handle or Handle()
    p.init(handle)
    outs = []
    for b, rows in enumerate(rows_by_batch, start):
        outs.append(call(p, rows, b, T0 + (b - 2) * STEP))
    if flush:
        outs.append(call(p, [], start + len(rows_by_batch), T0 + (start + len(rows_by_batch)) * STEP + 10 * GAP_MS))
    return outs, handle


@pytest.mark.parametrize("cls", [LogicProcessor, BucketProcessor], ids=["columnar", "per-key"])
def test_sealed_leaves_give_the_outputs_and_state_of_leaves_written_whole(cls, monkeypatch):
    sealed_seen = whole_seen = 0
    sessions = 0
    for seed in range(6):
        todo = batches(random.Random(seed), 12)
        got, h = run(cls, todo, flush=False)
        sealed_seen += forms(h)["bytes"]
        whole_seen += forms(h)["tuple"]
        with monkeypatch.context() as m:
            m.setattr(layout, "INLINE_SHARE", 0.0)  # every leaf written whole: version 1's leaves
            want, h1 = run(cls, todo, flush=False)
            assert forms(h1)["bytes"] == 0
        assert got == want, f"seed {seed}"
        assert opened(h) == opened(h1), f"seed {seed}"
        assert h.timers == h1.timers
        # the end of the stream: every session comes out, from sealed leaves as from whole ones
        got, h = run(cls, todo)
        assert got[-1] and got == want + run(cls, [], handle=h1, start=len(todo))[0]
        assert opened(h) == {}
        sessions += sum(len(o) for o in got)
    # both forms were stored: the comparison covered sealed leaves and whole ones
    assert sealed_seen > 100 and whole_seen > 100 and sessions > 1000


def test_a_bucket_of_layout_version_1_goes_on_under_version_2(monkeypatch):
    rng = random.Random(7)
    first, then = batches(rng, 6), batches(rng, 8)
    with monkeypatch.context() as m:  # what a release writing version 1 left in the state store
        m.setattr(layout, "LAYOUT_VERSION", 1)
        m.setattr(bucket_store, "LAYOUT_VERSION", 1)
        m.setattr(layout, "INLINE_SHARE", 0.0)
        old_outs, h = run(LogicProcessor, first, flush=False)
    assert Directory.loads(h.values[DIR_VARIABLE].value[0]).version == 1 and forms(h)["bytes"] == 0
    outs, h = run(LogicProcessor, then, handle=h, start=len(first), flush=False)
    new_outs, h2 = run(LogicProcessor, first + then, flush=False)
    assert old_outs + outs == new_outs
    assert opened(h) == opened(h2) != {}
    assert Directory.loads(h.values[DIR_VARIABLE].value[0]).version == 2  # an older release refuses it now
    assert forms(h)["bytes"] > 0
    end = len(first) + len(then)
    assert run(LogicProcessor, [], handle=h, start=end)[0] == run(LogicProcessor, [], handle=h2, start=end)[0] != [[]]


def test_a_layout_version_this_release_does_not_read_is_refused_in_a_sentence():
    d = Directory.new(4, ("n",), "{}", "{}")
    blob = pickle.dumps((3, *pickle.loads(d.dumps())[1:]))
    with pytest.raises(StateSchemaError, match=r"^batched engine: state layout version 3 is not supported \(this "
                                               r"release reads versions 1, 2\): the checkpoint was written by a newer"
                                               r" sparkstate$"):
        Directory.loads(blob)
