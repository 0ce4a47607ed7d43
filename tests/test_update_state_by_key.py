"""update_state_by_key on a real stream: DStream semantics batch by batch, and a query under
``trigger(availableNow=True)`` that ends once its input is processed."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import pytest

import sparkstate as ss
from sparkstate.engines.checkpoint import operators
from tests.streams import LandingDir


@dataclass
class Tally:
    total: int
    visits: int


def tally(new, state):
    """A running total and the number of batches the key was called in; a 0 among the new
    values removes the key (returns None)."""
    if 0 in new:
        return None
    old = state or Tally(0, 0)
    return Tally(old.total + sum(new), old.visits + 1)


def dstream_reference(batches):
    """What DStream updateStateByKey gives: after each batch, every key with state, called with
    its new values (an empty list for a key without any) in every batch."""
    state: dict = {}
    out = []
    for rows in batches:
        new: dict = {}
        for r in rows:
            new.setdefault(r["word"], []).append(r["n"])
        for k in set(state) | set(new):
            s = tally(new.get(k, []), state.get(k))
            if s is None:
                state.pop(k, None)
            else:
                state[k] = s
        out.append(sorted((k, s.total, s.visits) for k, s in state.items()))
    return out


def file_batches(seed):
    """Five micro-batches' rows, shuffled: 'keep' gets rows only in the first batch (revisited
    after), 'gone' is removed in the third, the others come and go."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(12)]
    batches = []
    for b in range(5):
        rows = [{"word": "keep", "n": 7}] if b == 0 else []
        rows += [{"word": "gone", "n": 0 if b == 2 else 1}] if b <= 2 else []
        rows += [{"word": w, "n": rng.randint(1, 9)} for w in rng.sample(words, 4) for _ in range(rng.randint(1, 3))]
        rng.shuffle(rows)
        batches.append(rows)
    return batches


def run_available_now(spark, land, checkpoint):
    """Run update_state_by_key over what ``land`` holds, availableNow; the rows of each batch."""
    words = land.stream(spark, "word string, n long")
    out = ss.update_state_by_key(words, key="word", value="n", func=tally, state_type=Tally,
                                 checkpoint=checkpoint)
    got: dict = {}
    lock = threading.Lock()

    def collect(df, batch_id):
        rows = sorted((r.word, r.total, r.visits) for r in df.collect())
        with lock:
            got[batch_id] = rows

    query = (out.writeStream.outputMode("update").foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        ended = query.awaitTermination(300)
    finally:
        query.stop()
    assert ended is True, "the availableNow query did not end by itself"
    assert query.exception() is None
    return [got[b] for b in sorted(got)]


@pytest.mark.parametrize("seed", [1, 2])
def test_available_now_ends_with_dstream_semantics_and_restarts(spark, tmp_path, seed):
    batches = file_batches(seed)
    land = LandingDir(tmp_path / "in")
    for rows in batches[:3]:
        land.add(rows)
    checkpoint = tmp_path / "ck"
    want = dstream_reference(batches)
    first = run_available_now(spark, land, checkpoint)
    # One output per micro-batch with input (no empty batches), each every key's state.
    assert first == want[:3]
    assert ("keep", 7, 3) in first[2]  # no new values in batches 2 and 3: called anyway
    assert not any(k == "gone" for k, *_ in first[2])  # returned None: removed
    for rows in batches[3:]:
        land.add(rows)
    second = run_available_now(spark, land, checkpoint)
    assert second == want[3:]
    assert ("keep", 7, 5) in second[-1]


def test_old_timer_checkpoint_goes_on_the_old_way(spark, tmp_path):
    """A checkpoint written by the adapter of before (processing-time mode, a 1 ms timer per key:
    as the unpacked batched engine still runs it) keeps that mode when the query names it."""
    batches = file_batches(3)
    land = LandingDir(tmp_path / "in")
    land.add(batches[0])
    checkpoint = tmp_path / "ck"
    words = land.stream(spark, "word string, n long")
    old = ss.update_state_by_key(words, key="word", value="n", func=tally, state_type=Tally,
                                 engine=ss.BatchedEngine(pack=False))
    q = (old.writeStream.outputMode("update").format("memory").queryName(f"old_{tmp_path.name}")
         .option("checkpointLocation", str(checkpoint)).trigger(processingTime="200 milliseconds").start())
    try:
        while not q.recentProgress or sum(p["numInputRows"] for p in q.recentProgress) < len(batches[0]):
            q.awaitTermination(0.2)
            assert q.exception() is None
    finally:
        q.stop()
    ops = operators(spark, checkpoint)
    assert [op["time_mode"] for op in ops] == ["ProcessingTime"]
    land.add(batches[1])
    out = ss.update_state_by_key(land.stream(spark, "word string, n long"), key="word", value="n", func=tally,
                                 state_type=Tally, checkpoint=checkpoint)
    got = []
    q = (out.writeStream.outputMode("update").foreachBatch(lambda df, _: got.append(df.count()))
         .option("checkpointLocation", str(checkpoint)).trigger(processingTime="200 milliseconds").start())
    try:
        while len(got) < 3:  # the old way: no-data batches keep revisiting every key
            q.awaitTermination(0.2)
            assert q.exception() is None
    finally:
        q.stop()
    assert all(n > 0 for n in got)
