"""``python -m benchmarks.loop``: the batched engine's per-key loop on one bucket, without Spark.

It drives the batched engine's StatefulProcessor (``sparkstate.engines.batched.processor``)
directly, the way ``transformWithStateInPandas`` calls it for one bucket, with in-memory
stand-ins for the two state variables (a value state, a map state), the timer calls and the
batch's ``TimerValues``. Nothing in ``src/`` is changed or patched: the processor's own
``input.group`` (the input: Arrow or pandas to Row values grouped by key) and ``process`` (the
leaves read, the per-key calls, the leaves written, the output frame) run as they do in a
worker. Its helpers ``store.load_leaves``, ``store.save`` and ``frame`` are wrapped on their
instances (timed, and ``frame``'s rows kept for the check), so the time (this thread's CPU time, which
another process on the core does not inflate; ``wall`` beside it) splits into:

- ``group``: the input to Row values grouped by key (packed Arrow for the count, pandas rows for
  the sessions, as the engine feeds each in the benchmark suite);
- ``load``: the leaves the keys fall in, unpickled;
- ``loop``: per key, the leaf placement, the state decoded, a ``GroupState``, the user's
  function, its outcome, the state and outputs encoded (``process`` minus load, save, frame);
- ``save``: the changed leaves pickled (split when full) and the directory written;
- ``frame``: the outputs as one pandas DataFrame;
- ``gc``: the collection the first allocations set off once the bucket's call has returned and
  the cyclic collector is back on (it walks what the call built).

Workloads, the same functions as the suite's ``sparkstate-batched`` contenders:

- ``count``: ``benchmarks.contenders.count_per_key`` (``int`` state, update mode), packed input
  ``user string, seq long, activity string``;
- ``sessions``: ``sparkstate.pipelines.sessionize``'s group function in event time (an
  ``OpenSession`` state, flat, append mode, ``EventTimeTimeout``), unpacked input
  ``user_id, event_time, data, is_last``, a key's events 54 s apart plus a jitter below 10 s,
  1 in 10 flagged last, the watermark 10 s behind the previous batch's latest event.

Every key of the bucket is touched in every batch with ``--events-per-key`` events. Batch 0
creates every key's state (reported apart, as ``first``); ``--batches`` more are timed. With
``--check`` (on by default) the outputs of every batch, and of a last no-data batch whose
watermark fires every open session, are compared with :class:`sparkstate.testing.GroupStateHarness`
on the same input; a difference is an error, so the figure cannot be of a loop that did
nothing. ``--profile`` runs one more pass under cProfile and prints where the time goes.

>>> r = run("count", keys=200, batches=2, events_per_key=2, repeats=1)
>>> r["checked"], r["keys"], r["per_key_us"]["loop"] > 0
(True, 200, True)
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.types import (ArrayType, BooleanType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from sparkstate.engines.base import StatePlan
from sparkstate.engines.batched.layout import BUCKET_COLUMN, HASH_COLUMN
from sparkstate.engines.batched.grouping import gc_paused
from sparkstate.engines.batched.processor import BucketProcessor
from sparkstate.group_state import GroupStateTimeout
from sparkstate.pipelines.columnar_sessionizer import SessionLogic
from sparkstate.pipelines.sessionizer import OpenSession, Sessionizer
from sparkstate.testing import GroupStateHarness
from sparkstate.types import Codec, encoder_for

from .contenders import count_per_key

WORKLOADS = ("count", "sessions")
PHASES = ("group", "load", "loop", "save", "frame", "gc")
#: The engine's defaults (BatchedEngine()).
BUCKETS, LEAF_ROWS = 64, 64
GAP_MS, WATERMARK_MS = 60_000, 10_000
START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z, as the suite's sessions input
PT0_MS = 1_800_000_000_000


# -- stand-ins for what transformWithStateInPandas hands the processor --------------------------

class ValueState:
    """``ValueState`` in memory (a row tuple or None)."""

    def __init__(self) -> None:
        self.value: Any = None

    def get(self) -> Any:
        return self.value

    def exists(self) -> bool:
        return self.value is not None

    def update(self, row: tuple) -> None:
        self.value = tuple(row)

    def clear(self) -> None:
        self.value = None


class MapState:
    """``MapState`` in memory: key tuple -> value tuple."""

    def __init__(self) -> None:
        self.data: dict = {}

    def getValue(self, key: tuple) -> Any:
        return self.data.get(tuple(key))

    def containsKey(self, key: tuple) -> bool:
        return tuple(key) in self.data

    def updateValue(self, key: tuple, value: tuple) -> None:
        self.data[tuple(key)] = tuple(value)

    def removeKey(self, key: tuple) -> None:
        self.data.pop(tuple(key), None)

    def iterator(self) -> Iterator[tuple]:
        return iter(list(self.data.items()))

    def keys(self) -> Iterator[tuple]:
        return iter(list(self.data))

    def values(self) -> Iterator[tuple]:
        return iter(list(self.data.values()))

    def clear(self) -> None:
        self.data.clear()


class Handle:
    """``StatefulProcessorHandle``: the state variables and the timers."""

    def __init__(self) -> None:
        self.values: dict[str, ValueState] = {}
        self.maps: dict[str, MapState] = {}
        self.timers: set[int] = set()

    def getValueState(self, name: str, schema: Any, ttl_duration_ms: Any = None) -> ValueState:
        return self.values.setdefault(name, ValueState())

    def getMapState(self, name: str, key_schema: Any, value_schema: Any, ttl_duration_ms: Any = None) -> MapState:
        return self.maps.setdefault(name, MapState())

    def registerTimer(self, ms: int) -> None:
        self.timers.add(ms)

    def deleteTimer(self, ms: int) -> None:
        self.timers.discard(ms)

    def listTimers(self) -> Iterator[int]:
        return iter(sorted(self.timers))


class Times:
    """``TimerValues`` of one batch."""

    def __init__(self, pt: int, wm: int) -> None:
        self.pt, self.wm = pt, wm

    def getCurrentProcessingTimeInMs(self) -> int:
        return self.pt

    def getCurrentWatermarkInMs(self) -> int:
        return self.wm


# -- the plans, as map_groups_with_state / sessionize compile them --------------------------------

COUNT_INPUT = StructType([StructField("user", StringType()), StructField("seq", LongType()),
                          StructField("activity", StringType())])
COUNT_OUTPUT = StructType([StructField("user", StringType()), StructField("count", LongType())])
SESSIONS_INPUT = StructType([StructField("user_id", StringType()), StructField("event_time", TimestampType()),
                             StructField("data", StringType()), StructField("is_last", BooleanType())])
SESSIONS_OUTPUT = StructType([
    StructField("user_id", StringType()), StructField("session_start", TimestampType()),
    StructField("session_end", TimestampType()), StructField("event_count", LongType()),
    StructField("events", ArrayType(StringType())), StructField("closed_by", StringType()),
])


def plan_for(workload: str) -> tuple[StatePlan, dict]:
    """The StatePlan the suite's ``sparkstate-batched`` contender runs, and the harness's arguments."""
    if workload == "count":
        func, state_type, out, timeout, flat = count_per_key, int, COUNT_OUTPUT, GroupStateTimeout.NoTimeout, False
        keys, mode, watermark = ("user",), "update", False
    elif workload == "sessions":
        func = Sessionizer(GAP_MS, "event", True, True)
        state_type, out, timeout, flat = OpenSession, SESSIONS_OUTPUT, GroupStateTimeout.EventTimeTimeout, True
        keys, mode, watermark = ("user_id",), "append", True
    else:
        raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")
    plan = StatePlan(
        operator=f"benchmarks.loop[{workload}]", key_columns=keys, func=func, flat=flat,
        state_codec=Codec.of(state_type, "state_type"), output_schema=out, output_encoder=encoder_for(out, "output"),
        timeout=timeout, keep_expired_state=False, state_ttl_ms=None, value_decoder=None, output_mode=mode,
        has_watermark=watermark, streaming=True,
        bucket_logic=SessionLogic(func, out.names) if workload == "sessions" else None,
    )
    return plan, dict(func=func, state_type=state_type, timeout=timeout, flat=flat, start_time_ms=PT0_MS)


def processor_for(workload: str, plan: StatePlan) -> BucketProcessor:
    """The processor as ``BatchedEngine.apply`` builds it: packed for the count, pandas rows for
    the event-time sessions (an input with a watermark is never packed)."""
    if workload == "count":
        schema = StructType(COUNT_INPUT.fields + [StructField(HASH_COLUMN, LongType(), True)])
        proc = BucketProcessor(plan, BUCKETS, LEAF_ROWS, schema)
    else:
        schema = StructType(SESSIONS_INPUT.fields + [StructField(HASH_COLUMN, LongType(), True),
                                                     StructField(BUCKET_COLUMN, IntegerType(), True)])
        proc = BucketProcessor(plan, BUCKETS, LEAF_ROWS, schema, packed=False, tz="UTC")
    proc.init(Handle())
    return proc


# -- the input ------------------------------------------------------------------------------------

def key_hashes(n: int) -> np.ndarray:
    """A fixed 64-bit hash per key (splitmix64 of its index), signed as Spark's xxhash64."""
    z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


class Batch:
    """One micro-batch of the bucket: the frames the processor gets, the harness's values, the clocks."""

    def __init__(self, frames: list, data: dict, pt: int, wm: int, max_event_ms: int | None) -> None:
        self.frames, self.data, self.pt, self.wm, self.max_event_ms = frames, data, pt, wm, max_event_ms


def make_batches(workload: str, keys: int, batches: int, events_per_key: int, seed: int = 7) -> list[Batch]:
    """Batch 0 (every key new) and ``batches`` more; every key gets ``events_per_key`` events in each."""
    names = [f"u{i:07d}" for i in range(keys)]
    hashes = key_hashes(keys)
    rng = np.random.default_rng(seed)
    out: list[Batch] = []
    wm = 0
    for b in range(batches + 1):
        # event j of every key, then event j + 1 (interleaved, as the suite's files)
        idx = np.tile(np.arange(keys), events_per_key)
        j = np.repeat(np.arange(events_per_key), keys)
        user = [names[i] for i in idx]
        pt = PT0_MS + 1000 * b
        if workload == "count":
            seq = (b * events_per_key + j).astype(np.int64)
            act = np.array(["view", "click", "scroll", "search", "buy"])[(idx + j) % 5]
            table = pa.table({"user": pa.array(user, pa.string()), "seq": pa.array(seq),
                              "activity": pa.array(act.tolist(), pa.string()), HASH_COLUMN: pa.array(hashes[idx])})
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            frames = [pd.DataFrame({BUCKET_COLUMN: [0], "_blob": [sink.getvalue().to_pybytes()]})]
            data: dict = {}
            for u, s, a in zip(user, seq.tolist(), act.tolist()):
                data.setdefault(u, []).append((u, s, a))
            out.append(Batch(frames, data, pt, 0, None))
            continue
        # sessions: a key's n-th event at START + n * 54 s + a jitter below 10 s (key-staggered)
        n = b * events_per_key + j
        ms = START_MS + n * 54_000 + rng.integers(0, 10_000, len(idx)) + idx * 7
        last = rng.random(len(idx)) < 0.1
        data_col = [f"/p{k}" for k in ((idx * 31 + n) % 8).tolist()]
        times = pd.to_datetime(ms, unit="ms")  # naive, in the session zone (UTC), as PySpark hands them
        frames = [pd.DataFrame({"user_id": user, "event_time": times, "data": data_col, "is_last": last,
                                HASH_COLUMN: hashes[idx], BUCKET_COLUMN: np.zeros(len(idx), np.int32)})]
        data = {}
        for u, t, d, f in zip(user, ms.tolist(), data_col, last.tolist()):
            data.setdefault(u, []).append((u, dt.datetime.fromtimestamp(t / 1000, dt.timezone.utc), d, f))
        out.append(Batch(frames, data, pt, wm, int(ms.max())))
        wm = max(wm, int(ms.max()) - WATERMARK_MS)  # the next batch's watermark
    return out


# -- two processors side by side (loop_vectorized, loop_sessions) --------------------------------

def side_by_side(data: list, contenders: dict, keys: int, repeats: int, rows: Callable,
                 pick: Callable = statistics.median) -> tuple[dict, dict]:
    """For each ``name -> (make, call)``: this thread's CPU microseconds per key and batch of
    ``call(processor, batch)`` over ``data`` (batch 0 left out, ``pick`` of the rest, including the
    collection the call's objects set off), median of ``repeats`` fresh processors; and the
    outputs of the last pass, each batch's through ``rows``."""
    per_key: dict = {}
    outputs: dict = {}
    for name, (make, call) in contenders.items():
        passes = []
        for _ in range(repeats):
            proc, times, outs = make(), [], []
            for b in data:
                t0 = cpu()
                out = call(proc, b)
                [object() for _ in range(1000)]  # the collection the call's objects set off
                times.append(cpu() - t0)
                outs.append(rows(out))
            passes.append(pick(times[1:]) / keys * 1e6)
        per_key[name] = round(statistics.median(passes), 2)
        outputs[name] = outs
    return per_key, outputs


def side_by_side_args(prog: str, doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of a side-by-side benchmark: the bucket's keys, batches, events, passes."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=25_000)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--events-per-key", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


# -- one pass -------------------------------------------------------------------------------------

#: Phases are timed in this thread's CPU time: on a shared machine the wall clock also counts
#: the time other processes held the core (measured: up to 4x the CPU time at load 9 on 2 cores).
cpu = time.thread_time


def _timed(obj: Any, name: str, clock: dict, keep: list | None = None) -> None:
    """Wrap ``obj.<name>`` on the instance, adding its CPU time to ``clock[name]``."""
    inner = getattr(obj, name)

    def wrapper(*args: Any) -> Any:
        t0 = cpu()
        try:
            return inner(*args)
        finally:
            clock[name] += cpu() - t0
            if keep is not None:
                keep.append(list(args[0]))

    setattr(obj, name, wrapper)


def one_pass(workload: str, batches: list[Batch], flush: bool = True) -> tuple[list[dict], list[list]]:
    """Run every batch through a fresh processor; per batch the seconds of each phase, and its outputs."""
    plan, _ = plan_for(workload)
    proc = processor_for(workload, plan)
    clock: dict = {}
    outputs: list[list] = []
    frames_rows: list[list] = []
    _timed(proc.store, "load_leaves", clock)
    _timed(proc.store, "save", clock)
    _timed(proc, "frame", clock, frames_rows)
    times: list[dict] = []
    for batch in batches:
        clock.update(load_leaves=0.0, save=0.0, frame=0.0)
        del frames_rows[:]
        tv = Times(batch.pt, batch.wm)
        w0 = time.perf_counter()
        with gc_paused():  # as handleInputRows
            t0 = cpu()
            groups, hashes = proc.input.group(iter(batch.frames))
            t1 = cpu()
            out = proc.process(groups, hashes, tv)
            t2 = cpu()
        # the collector is back on: the next allocations set off a collection over what the
        # bucket built (in a worker: while PySpark serializes the output)
        [object() for _ in range(1000)]
        t3 = cpu()
        w1 = time.perf_counter()
        del out
        inner = clock["load_leaves"] + clock["save"] + clock["frame"]
        times.append({"group": t1 - t0, "load": clock["load_leaves"], "loop": (t2 - t1) - inner,
                      "save": clock["save"], "frame": clock["frame"], "gc": t3 - t2, "total": t3 - t0,
                      "wall": w1 - w0, "keys": len(groups)})
        outputs.append([r for rows in frames_rows for r in rows])
    if flush and workload == "sessions":
        # a no-data batch whose watermark is past every session: the timeouts (handleExpiredTimer)
        del frames_rows[:]
        end = max(b.max_event_ms for b in batches) + GAP_MS + WATERMARK_MS + 1
        list(proc.handleExpiredTimer((0,), Times(batches[-1].pt + 1000, end), None))
        outputs.append([r for rows in frames_rows for r in rows])
    return times, outputs


def harness_outputs(workload: str, batches: list[Batch]) -> list[list]:
    """The same batches through GroupStateHarness, outputs encoded as the processor's are."""
    plan, kwargs = plan_for(workload)
    h = GroupStateHarness(**kwargs)
    enc = plan.output_encoder
    out = []
    for b in batches:
        wm = b.wm if workload == "sessions" else None
        out.append([enc(o) for o in h.run_batch(b.data, processing_time=b.pt, watermark=wm)])
    if workload == "sessions":
        end = max(b.max_event_ms for b in batches) + GAP_MS + WATERMARK_MS + 1
        out.append([enc(o) for o in h.run_batch({}, processing_time=batches[-1].pt + 1000, watermark=end)])
    return out


def _canon(rows: list) -> list:
    return sorted(repr(tuple(r)) for r in rows)


def check(workload: str, batches: list[Batch]) -> int:
    """Compare the processor's outputs with the harness's, batch by batch; the number of output rows."""
    _, got = one_pass(workload, batches)
    want = harness_outputs(workload, batches)
    if len(got) != len(want):
        raise AssertionError(f"{workload}: {len(got)} batches of output, the harness has {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if _canon(g) != _canon(w):
            raise AssertionError(f"{workload}: batch {i}: the processor's {len(g)} outputs differ from the"
                                 f" harness's {len(w)} (first: {g[:2]} vs {w[:2]})")
    rows = sum(len(g) for g in got)
    if rows == 0:
        raise AssertionError(f"{workload}: no output at all")
    return rows


def profile(workload: str, batches: list[Batch], top: int = 15) -> list[dict]:
    """One pass under cProfile: the ``top`` functions by own time, with their share of the pass."""
    prof = cProfile.Profile()
    prof.enable()
    one_pass(workload, batches, flush=False)
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    total = stats.total_tt or 1e-9
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{os.path.basename(file)}:{line}({fn})" if line else fn
        rows.append({"function": where, "calls": nc, "own_s": round(tt, 4), "own_pct": round(100 * tt / total, 1),
                     "cum_s": round(ct, 4), "cum_pct": round(100 * ct / total, 1)})
    rows.sort(key=lambda r: -r["own_s"])
    return rows[:top]


def run(workload: str, keys: int = 25_000, batches: int = 5, events_per_key: int = 5, repeats: int = 3,
        verify: bool = True, top: int = 0) -> dict:
    """The figures for one workload: per phase, microseconds per key of the timed batches."""
    data = make_batches(workload, keys, batches, events_per_key)
    result: dict[str, Any] = {"workload": workload, "keys": keys, "timed_batches": batches,
                              "events_per_key": events_per_key, "repeats": repeats, "buckets": 1,
                              "leaf_rows": LEAF_ROWS, "load_before": _load()}
    result["checked"] = False
    if verify:
        result["output_rows_checked"] = check(workload, data)
        result["checked"] = True
    passes = [one_pass(workload, data, flush=False)[0] for _ in range(repeats)]
    per_batch = [b for p in passes for b in p[1:]]  # batch 0 (every key new) left out
    first = [p[0] for p in passes]

    def us(samples: list[dict], phase: str, pick: Callable = statistics.median) -> float:
        return round(pick(s[phase] / s["keys"] for s in samples) * 1e6, 2)

    result["clock"] = "thread CPU time (time.thread_time); wall: perf_counter around the same"
    result["per_key_us"] = {ph: us(per_batch, ph) for ph in (*PHASES, "total", "wall")}
    result["per_key_us_best"] = {ph: us(per_batch, ph, min) for ph in (*PHASES, "total", "wall")}
    result["first_batch_per_key_us"] = {ph: us(first, ph) for ph in (*PHASES, "total", "wall")}
    result["load_after"] = _load()
    if top:
        result["profile"] = profile(workload, data, top)
    return result


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def table(results: list[dict]) -> str:
    head = ["workload", "keys", "ev/key", *PHASES, "total us/key", "best", "wall", "first batch", "checked", "load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|"]
    for r in results:
        u = r["per_key_us"]
        lines.append("| " + " | ".join([r["workload"], f"{r['keys']:,}", str(r["events_per_key"]),
                                        *(f"{u[p]:.2f}" for p in PHASES), f"**{u['total']:.2f}**",
                                        f"{r['per_key_us_best']['total']:.2f}", f"{u['wall']:.2f}",
                                        f"{r['first_batch_per_key_us']['total']:.2f}",
                                        "yes" if r["checked"] else "no", str(r["load_after"])]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loop", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workload", nargs="+", choices=[*WORKLOADS, "all"], default=["all"])
    p.add_argument("--keys", type=int, default=25_000, help="keys in the bucket")
    p.add_argument("--batches", type=int, default=5, help="timed batches after the first")
    p.add_argument("--events-per-key", type=int, default=5, help="events per key per batch")
    p.add_argument("--repeats", type=int, default=3, help="passes (fresh processor each); the median is reported")
    p.add_argument("--no-check", action="store_true", help="skip the comparison with GroupStateHarness")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="one more pass under cProfile: top N")
    p.add_argument("--json", type=str, help="write the results here too")
    a = p.parse_args(argv)
    kinds = WORKLOADS if "all" in a.workload else tuple(dict.fromkeys(a.workload))
    results = []
    print(f"benchmarks.loop: batched engine per-key loop, one bucket, {a.keys:,} keys; load {_load()}")
    for w in kinds:
        r = run(w, a.keys, a.batches, a.events_per_key, a.repeats, not a.no_check, a.profile)
        results.append(r)
        if r.get("profile"):
            print(f"\n{w}: cProfile, one pass ({a.batches + 1} batches), top {a.profile} by own time")
            for row in r["profile"]:
                print(f"  {row['own_pct']:5.1f}% own {row['cum_pct']:5.1f}% cum {row['calls']:>9,}  {row['function']}")
    print("\nCPU microseconds per key (median of the timed batches; best: the fastest; wall: elapsed, which on"
          " a busy machine counts other processes' turns too; first batch: every key new)\n")
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": ["python", "-m", "benchmarks.loop", *(argv or sys.argv[1:])], "results": results},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
