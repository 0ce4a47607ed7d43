"""``python -m benchmarks.soak``: a bounded soak run of sessionize on the generator; do batch time and state stay flat?

The job is the one ``sparkstate run`` runs (:func:`sparkstate.jobs.run_pipeline`): the seeded
generator source at a fixed ``--rate`` of ``--users`` users, sessionized in event time with a
``--gap`` (sessions close and their state expires) on the pipeline's default engine (or
``--engine``), a Parquet sink, a metrics file with one JSON line per micro-batch.
``--minutes`` after the first micro-batch completed (start-up is not counted; with
``--min-batches N``, once N batches have completed too, at most 3 x ``--minutes``) the job is
stopped between micro-batches, and the run is analysed (time 0 is the first batch's start).

While it runs, two samplers watch it: every ``--sample-every`` seconds the load average, the
state's bytes on disk and the memory of the driver, the JVM and the Python workers; and at
random intervals averaging ``--state-every`` seconds the keys in state, read from the
checkpoint with ``sparkstate.state.read`` at the last committed batch (the state store's own
row count is not the number of keys for every engine: the batched engine stores buckets and
leaves). Random intervals, so that the samples do not alias with the generator's rounds.

Then: per third of the run (warm-up, middle, last) p50/p95 batch duration, events/s, keys in
state; a least-squares slope over the second half (after warm-up), as a drift over that half
relative to its mean; and the checks (all must pass, else the exit code is 1):

==================  =====================================================================
``state_keys``      keys in state (checkpoint samples): the last third's mean within
                    ``--state-tolerance`` of the middle third's, and the second half's drift
                    within it too (either direction)
``state_rows``      the state store's rows (``numRowsTotal``): likewise
``state_memory``    RocksDB memory. With a bound (``boundedMemoryUsage``, as
                    :func:`sparkstate.spark_session` sets): never more than 25% above it, and
                    flat (the 90th percentile of the window's second half vs its first, and drift) from the batch at which
                    it reached 90% of it: RocksDB's block cache keeps the blocks of files that
                    compaction replaced until it is full, so the memory rises to the bound and
                    stays there (:func:`memory_check`). ``make soak`` runs with a 4 MB bound
                    (``--rocksdb-memory-mb``) so that it is reached within the warm-up; with
                    spark_session's 64 MB it takes hours on this workload, and a run that has
                    not reached its bound is judged on the bound alone. Without a bound: the
                    median grows by neither measure more than the tolerance
``state_disk``      state bytes on disk, from the first moment it shrank (Spark's retention of
                    ``minBatchesToRetain`` = 100 batches began deleting old versions; before
                    that the disk grows by design, a changelog file per batch): the second half
                    of that window vs its first half, and its drift, within the tolerance.
                    Not judged in a run too short to reach it (under 100 batches, or less than
                    :data:`DISK_MIN_WINDOW_MIN` minutes after it); a failure in a run of more
                    than 100 + :data:`DISK_WARMUP_MARGIN` batches in which it never shrank
``batch_duration``  p50 of the last third and the second half's drift: neither grows by more
                    than ``--duration-tolerance`` (a machine shared with other jobs is noisy;
                    the load average is recorded beside it)
``keeps_up``        events/s read over the last third >= (1 - ``--rate-tolerance``) x rate
``expired_state``   at every state sample and at the end, the keys in the checkpoint are
                    exactly the users whose session is still open by the reference
                    (:func:`~sparkstate.synthetic.reference_sessions` over the records that
                    batch had read, at its watermark), and at the end each has a pending
                    timeout (its session's end + gap) not yet due: expired sessions leave
                    nothing behind
``output_exact``    the sessions in the Parquet sink are the reference's: none lost, none
                    duplicated, none made up
==================  =====================================================================

Keys are users, so the state can never hold more than ``--users`` keys; a leak of expired state
would show as every user ever seen staying in state (flat at ``users``), which
``expired_state`` tells apart from the open sessions. Outputs in ``--out``: ``soak.json``
(settings, machine, figures, checks), ``metrics.jsonl``, ``samples.jsonl``,
``state_samples.jsonl``, ``state_store.jsonl`` (RocksDB's own figures per batch),
``soak_batch_duration.png``, ``soak_state.png``, ``soak_resources.png``, ``soak_levels.png``
(where RocksDB memory, the state on disk and the processes' memory level off: :func:`levels`,
also in ``soak.json``; ``--levels OUT`` recomputes them for a finished run) and ``report/``
(``sparkstate report``'s plots and summary of the metrics file).

>>> pts = [Point(t / 6, 100.0, 50.0, 1e6, 100, 0) for t in range(31)]  # a batch every 10 s
>>> keys = [(t / 4, 40.0) for t in range(21)]
>>> a = analyse(pts, keys, [], rate=10.0, tolerances=Tolerances())
>>> [(c.name, c.ok) for c in a["checks"]]  # doctest: +NORMALIZE_WHITESPACE
[('state_keys', True), ('state_rows', True), ('state_memory', True), ('batch_duration', True),
 ('keeps_up', True)]
>>> leaky = [(t / 4, 40.0 + 5 * t) for t in range(21)]
>>> [c.name for c in analyse(pts, leaky, [], rate=10.0, tolerances=Tolerances())["checks"] if not c.ok]
['state_keys']
>>> swing = [(t / 4, 40.0 + (80 if t == 15 else 0)) for t in range(21)]  # one sample: the third moves, not the drift
>>> [c.name for c in analyse(pts, swing, [], rate=10.0, tolerances=Tolerances())["checks"] if not c.ok]
['state_keys']
>>> short = Tolerances(state_both_ways=False, state_growth_on_both=True)
>>> [c.name for c in analyse(pts, swing, [], rate=10.0, tolerances=short)["checks"] if not c.ok]
[]
>>> [c.name for c in analyse(pts, leaky, [], rate=10.0, tolerances=short)["checks"] if not c.ok]
['state_keys']
>>> slower = [Point(t / 6, 100.0 + 20 * t, 50.0, 1e6, 100, 0) for t in range(31)]
>>> [c.name for c in analyse(slower, keys, [], rate=10.0, tolerances=Tolerances())["checks"] if not c.ok]
['batch_duration']
"""

from __future__ import annotations

import argparse
from bisect import bisect_left, bisect_right
import datetime as dt
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .measure import SamplingLoop, TreeSampler, load_average

#: The job's query.
QUERY_NAME = "sparkstate_soak"
#: A run whose first micro-batch has not completed after this long is stopped (and fails its checks).
STARTUP_LIMIT_S = 600.0
#: Spark's default ``spark.sql.streaming.minBatchesToRetain``.
RETAINED_BATCHES = 100
#: Batches past the retention by which the first old version should have been deleted: a
#: snapshot every ``minDeltasForSnapshot`` (10) batches, uploaded and cleaned up by the
#: maintenance task (every 60 s, up to 60 batches at a 1-second trigger).
DISK_WARMUP_MARGIN = 80
#: The prefix of Spark's RocksDB settings.
ROCKSDB = "spark.sql.streaming.stateStore.rocksdb"
#: The soak's own bound on RocksDB's memory (MB, all state stores of the JVM): small enough for
#: the block cache to fill within the warm-up, so that the run shows where the memory levels off.
SOAK_ROCKSDB_MEMORY_MB = 4
#: RocksDB memory counts as full (its cache at its bound) from this share of the bound on ...
MEMORY_FULL = 0.9
#: ... and may exceed the bound by this share: the LRU cache's limit is not strict.
MEMORY_SLACK = 0.25
#: The shortest window (minutes) the disk is judged over after its warm-up: a few maintenance rounds.
DISK_MIN_WINDOW_MIN = 2.0


def disk_window(points: Sequence[Point], disk: Series, retained_batches: int = RETAINED_BATCHES
                ) -> tuple[float, list[tuple[float, float]]] | None:
    """Where the state on disk is judged: from the first sample at which it had shrunk (Spark's
    retention began deleting old versions: before that the disk grows by design, a changelog
    file per batch) to the end, if that is at least :data:`DISK_MIN_WINDOW_MIN` minutes; else ``None``.

    >>> pts = [Point(m / 10, 1.0, 1.0, 1.0, 1, 0) for m in range(100)]
    >>> disk = [(m / 10, float(min(m, 50) - (m % 5 if m > 50 else 0))) for m in range(100)]
    >>> disk_window(pts, disk, 40)[0]
    5.1
    >>> disk_window(pts, [(m / 10, float(m)) for m in range(100)], 40) is None  # never shrank
    True
    """
    if len(points) <= retained_batches:
        return None
    peak = -math.inf
    for i, (m, v) in enumerate(disk):
        if v < peak * 0.995:
            end = disk[-1][0]
            return (m, disk[i:]) if end - m >= DISK_MIN_WINDOW_MIN else None
        peak = max(peak, v)
    return None


@dataclass(frozen=True)
class SoakConfig:
    """One soak run: the generator, the sessionize job, and how long."""

    minutes: float = 10.0
    rate: float = 500.0
    users: int = 2000
    seed: int = 7
    gap: str = "1 minute"
    watermark: str = "10 seconds"
    trigger: str = "1 second"
    engine: str | None = None
    #: Run on past ``minutes`` until this many micro-batches have completed (a loaded machine), ...
    min_batches: int = 0
    #: ... but stop at this many minutes after the first batch whatever (``None``: 3 x ``minutes``).
    max_minutes: float | None = None
    sample_every_s: float = 5.0
    state_every_s: float = 15.0

    @property
    def source(self) -> str:
        return f"generator:rate={self.rate:g},users={self.users},seed={self.seed},gap={self.gap}"


@dataclass(frozen=True)
class Tolerances:
    """How far the second part of a run may move from the middle and still count as flat (shares)."""

    state: float = 0.2
    duration: float = 0.5
    rate: float = 0.15
    #: Whether the state may not shrink either (False: only growth, a leak, fails: a short run's
    #: few samples swing with the rounds, and what is left is checked exactly besides).
    state_both_ways: bool = True
    #: Whether keys and rows in state fail only when both measures, the last third against the
    #: middle and the second half's drift, grow past ``state`` (True: a short run samples each
    #: third a few times over rounds of sessions, so one measure alone can swing; a leak moves
    #: both).
    state_growth_on_both: bool = False


@dataclass(frozen=True)
class Point:
    """One micro-batch: minutes since the first batch began, and its figures from the metrics file."""

    minute: float
    duration_ms: float | None
    state_rows: float | None
    state_memory_bytes: float | None
    rows_in: int
    rows_out: int


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


# --- analysis (pure) ---------------------------------------------------------------------------

Series = Sequence[tuple[float, float]]  # (minute, value)


def slope(xs: Sequence[float], ys: Sequence[float | None]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs`` (``None`` with fewer than 3 points).

    >>> slope([0, 1, 2, 3], [1, 3, 5, 7])
    2.0
    """
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None and not math.isnan(y)]
    if len(pairs) < 3 or len({x for x, _ in pairs}) < 2:
        return None
    x = np.array([p[0] for p in pairs], dtype=float)
    y = np.array([p[1] for p in pairs], dtype=float)
    return round(float(np.polyfit(x, y, 1)[0]), 6)


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if len(values) else None


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 1) if values else None


def _median(values: Sequence[float]) -> float | None:
    return round(float(statistics.median(values)), 1) if values else None


def series(points: Sequence[Point], name: str) -> list[tuple[float, float]]:
    """``(minute, value)`` of one field of the batches, where it is known."""
    return [(p.minute, getattr(p, name)) for p in points if getattr(p, name) is not None]


def consumption_rate(points: Sequence[Point]) -> float | None:
    """Events per second read over ``points``: the slope of the cumulative input over time.

    >>> round(consumption_rate([Point(m / 60, None, None, None, 100, 0) for m in range(10)]), 1)
    100.0
    """
    if len(points) < 3:
        return None
    total, cum = 0, []
    for p in points:
        total += p.rows_in
        cum.append(total)
    s = slope([p.minute * 60 for p in points], cum)
    return None if s is None else round(s, 1)


def _split(items: Sequence[Any], minute: Callable[[Any], float], end: float) -> list[list[Any]]:
    bounds = ((-math.inf, end / 3), (end / 3, 2 * end / 3), (2 * end / 3, math.inf))
    return [[i for i in items if lo <= minute(i) < hi] for lo, hi in bounds]


def _drift(values: Series, scale: float | None) -> dict[str, Any]:
    """Slope per minute over ``values`` and the change it makes over their span, relative to ``scale``."""
    s = slope([m for m, _ in values], [v for _, v in values])
    span = values[-1][0] - values[0][0] if values else 0.0
    rel = None if s is None or not scale else round(s * span / scale, 4)
    return {"slope_per_min": s, "span_min": round(span, 2), "relative_drift": rel, "samples": len(values)}


def _rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b - 1.0, 4)


def _pct_text(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def analyse(points: Sequence[Point], keys: Series, disk: Series, rate: float, tolerances: Tolerances,
            retained_batches: int = RETAINED_BATCHES, memory_bound_mb: float | None = None) -> dict[str, Any]:
    """Thirds, second-half slopes and the flatness checks of a run (see the module docstring).

    ``points``: the batches; ``keys``: keys in state sampled from the checkpoint; ``disk``: state
    bytes on disk sampled (``[]``: not judged).
    """
    if len(points) < 9:
        return {"thirds": [], "second_half": {}, "checks": [
            Check("enough_batches", False, f"{len(points)} micro-batches: too few to judge a trend (9 or more)")]}
    end = points[-1].minute
    thirds = _split(points, lambda p: p.minute, end)
    key_thirds = _split(keys, lambda k: k[0], end)
    summaries = []
    for t, k in zip(thirds, key_thirds):
        durations = [p.duration_ms for p in t if p.duration_ms is not None]
        rows = [p.state_rows for p in t if p.state_rows is not None]
        mem = [p.state_memory_bytes for p in t if p.state_memory_bytes is not None]
        kv = [v for _, v in k]
        summaries.append({
            "from_min": round(t[0].minute, 2) if t else None, "to_min": round(t[-1].minute, 2) if t else None,
            "batches": len(t), "events": sum(p.rows_in for p in t), "sessions": sum(p.rows_out for p in t),
            "events_per_s": consumption_rate(t), "p50_ms": _pct(durations, 50), "p95_ms": _pct(durations, 95),
            "state_keys_mean": _mean(kv), "state_keys_min": min(kv) if kv else None,
            "state_keys_max": max(kv) if kv else None, "state_key_samples": len(kv),
            "state_rows_mean": _mean(rows), "state_memory_mb_median": None if not mem else round(
                statistics.median(mem) / 1e6, 3),
        })
    mid, last = summaries[1], summaries[2]
    half = end / 2
    h_points = [p for p in points if p.minute >= half]
    h_keys = [k for k in keys if k[0] >= half]
    h_rows = series(h_points, "state_rows")
    h_mem = series(h_points, "state_memory_bytes")
    h_dur = series(h_points, "duration_ms")
    h_disk = [d for d in disk if d[0] >= half]
    second = {
        "from_min": round(half, 2), "batches": len(h_points),
        "state_keys": _drift(h_keys, _mean([v for _, v in h_keys])) | {"mean": _mean([v for _, v in h_keys])},
        "state_rows": _drift(h_rows, _mean([v for _, v in h_rows])) | {"mean": _mean([v for _, v in h_rows])},
        "state_memory_bytes": _drift(h_mem, _median([v for _, v in h_mem])) | {
            "median": _median([v for _, v in h_mem])},
        "batch_duration_ms": _drift(h_dur, _median([v for _, v in h_dur])) | {"p50": _median([v for _, v in h_dur])},
        "state_disk_bytes": _drift(h_disk, _mean([v for _, v in h_disk])) | {"mean": _mean([v for _, v in h_disk])},
    }
    checks: list[Check] = []

    def within(name: str, rel_third: float | None, rel_drift: float | None, tol: float, both_ways: bool,
               what: str, note: str = "", on_both: bool = False) -> None:
        def bad(x: float | None) -> bool:
            return x is None or (abs(x) if both_ways else x) > tol

        sign = "±" if both_ways else "+"
        failed = (bad(rel_third) and bad(rel_drift)) if on_both else (bad(rel_third) or bad(rel_drift))
        rule = ", failed only by both" if on_both else ""
        checks.append(Check(name, not failed,
                            f"{what}: last third vs middle {_pct_text(rel_third)}, drift over the second half"
                            f" {_pct_text(rel_drift)} (limit {sign}{tol:.0%}{rule}){note}"))

    within("state_keys", _rel(last["state_keys_mean"], mid["state_keys_mean"]),
           second["state_keys"]["relative_drift"], tolerances.state, tolerances.state_both_ways,
           "keys in state (checkpoint samples, mean)",
           f"; {mid['state_key_samples']} and {last['state_key_samples']} samples", tolerances.state_growth_on_both)
    within("state_rows", _rel(last["state_rows_mean"], mid["state_rows_mean"]),
           second["state_rows"]["relative_drift"], tolerances.state, tolerances.state_both_ways, "state store rows (mean)",
           on_both=tolerances.state_growth_on_both)
    if memory_bound_mb is None:
        within("state_memory", _rel(last["state_memory_mb_median"], mid["state_memory_mb_median"]),
               second["state_memory_bytes"]["relative_drift"], tolerances.state, False, "RocksDB memory (median)")
    else:
        check, second["state_memory_bytes"]["bound"] = memory_check(
            series(points, "state_memory_bytes"), memory_bound_mb, tolerances.state)
        checks.append(check)
    window = disk_window(points, disk, retained_batches)
    second["state_disk_bytes"]["judged"] = window is not None
    if window is not None:
        w_start, w_values = window
        mid_w = w_start + (end - w_start) / 2
        first_half = _mean([v for m, v in w_values if m < mid_w])
        last_half = _mean([v for m, v in w_values if m >= mid_w])
        w_drift = _drift(w_values, _mean([v for _, v in w_values]))
        second["state_disk_bytes"]["window"] = {"from_min": round(w_start, 2), "first_half_mean": first_half,
                                                 "last_half_mean": last_half} | w_drift
        within("state_disk", _rel(last_half, first_half), w_drift["relative_drift"], tolerances.state,
               False, "state on disk (mean), from the first deletion of old versions on",
               f"; window {w_start:.1f}-{end:.1f} min, its second half vs its first")
    elif disk and len(points) > retained_batches + DISK_WARMUP_MARGIN:
        checks.append(Check("state_disk", False, f"{len(points)} batches and the state on disk never shrank:"
                            f" Spark's retention of {retained_batches} batches deleted nothing"))
    within("batch_duration", _rel(last["p50_ms"], mid["p50_ms"]), second["batch_duration_ms"]["relative_drift"],
           tolerances.duration, False, "batch duration (p50)")
    got = last["events_per_s"]
    checks.append(Check("keeps_up", got is not None and got >= (1 - tolerances.rate) * rate,
                        f"events/s read over the last third {got} for a rate of {rate:g}"
                        f" (limit -{tolerances.rate:.0%})"))
    return {"thirds": summaries, "second_half": second, "checks": checks}


def memory_check(mem: Series, bound_mb: float, tol: float) -> tuple[Check, dict[str, Any]]:
    """RocksDB memory against its bound (``maxMemoryUsageMB`` with ``boundedMemoryUsage``).

    RocksDB's block cache is filled, never emptied (blocks of files that compaction replaced stay
    until the cache is full), so the memory rises until it reaches the bound, then stays: it is
    judged flat from the first batch at which it reached :data:`MEMORY_FULL` of the bound (the
    90th percentile of the window's second half vs its first, and its drift relative to it:
    the figure of one batch swings by MBs as memtables fill and are flushed, so the level the
    cache holds is its upper envelope, not its median), and never above the bound by more than
    :data:`MEMORY_SLACK` (the cache's limit is not strict, and memtables count in it). A run
    that never reached its bound is judged on the bound alone, and the rate it filled at is
    reported.

    >>> flat = [(m / 10, min(4.0, 1 + m / 10) * 2 ** 20) for m in range(100)]
    >>> memory_check(flat, 4, 0.2)[0].ok, memory_check(flat, 4, 0.2)[1]["full_from_min"]
    (True, 2.6)
    >>> memory_check([(m / 10, (1 + m / 10) * 2 ** 20) for m in range(100)], 4, 0.2)[0].ok  # past its bound
    False
    """
    cap = bound_mb * 2 ** 20
    top = max((v for _, v in mem), default=0.0)
    full_at = next((m for m, v in mem if v >= MEMORY_FULL * cap), None)
    info: dict[str, Any] = {"bound_mb": bound_mb, "max_mb": round(top / 2 ** 20, 3),
                            "full_from_min": full_at, "fill_mb_per_min": None}
    over = top > cap * (1 + MEMORY_SLACK)
    bound_text = f"max {top / 2 ** 20:.2f} MB for a bound of {bound_mb:g} MB (limit +{MEMORY_SLACK:.0%})"
    if full_at is None:
        s = slope([m for m, _ in mem], [v for _, v in mem])
        info["fill_mb_per_min"] = None if s is None else round(s / 2 ** 20, 4)
        return Check("state_memory", not over and bool(mem),
                     f"RocksDB memory: {bound_text}; not full yet (filling at"
                     f" {info['fill_mb_per_min']} MB/min), judged on its bound"), info
    window = [(m, v) for m, v in mem if m >= full_at]
    end = mem[-1][0]
    mid = full_at + (end - full_at) / 2
    first = _pct([v for m, v in window if m < mid], 90)
    last = _pct([v for m, v in window if m >= mid], 90)
    drift = _drift(window, _pct([v for _, v in window], 90))
    rel = _rel(last, first)
    info.update({"window_first_half_p90_mb": None if first is None else round(first / 2 ** 20, 3),
                 "window_last_half_p90_mb": None if last is None else round(last / 2 ** 20, 3)} | drift)
    flat = rel is not None and drift["relative_drift"] is not None and rel <= tol and drift["relative_drift"] <= tol
    return Check("state_memory", flat and not over,
                 f"RocksDB memory: {bound_text}; full from minute {full_at:.1f}, then its second half vs its first (p90)"
                 f" {_pct_text(rel)}, drift {_pct_text(drift['relative_drift'])} (limit +{tol:.0%})"), info


#: A series has levelled off from the first minute after which its rolling median stays within
#: this share of its level (the median of the run's last third) ...
LEVEL_BAND = 0.15
#: ... the rolling median taken over this many minutes (the disk saws between maintenance rounds).
LEVEL_WINDOW_MIN = 2.0


def level_off(values: Series, end: float, band: float = LEVEL_BAND, window: float = LEVEL_WINDOW_MIN,
              q: float = 50) -> dict[str, Any]:
    """Where a series levels off: its level (the ``q``-th percentile, by default the median, of
    the last third of the run), that percentile of each third, its maximum, and the first
    minute from which its rolling ``q``-th percentile (over ``window`` minutes) stays within
    ``band`` of the level to the end (``None``: it was still moving in the last third, i.e. not
    level). ``q=90`` follows the upper envelope of a series that swings, like RocksDB's memory.

    >>> rise = [(m / 10, min(m / 10, 5.0)) for m in range(300)]  # rises for 5 minutes, then flat
    >>> level_off(rise, 29.9)["from_min"], level_off(rise, 29.9)["level"]
    (4.3, 5.0)
    >>> level_off([(m / 10, m / 10) for m in range(300)], 29.9)["from_min"] is None  # still rising
    True
    """
    values = [(m, v) for m, v in values if m >= 0]
    thirds = _split(values, lambda x: x[0], end)
    level = _pct([v for _, v in thirds[2]], q)
    out: dict[str, Any] = {"level": level, "percentile": q, "thirds": [_pct([v for _, v in t], q) for t in thirds],
                           "max": max((v for _, v in values), default=None), "from_min": None}
    if level is None or not values:
        return out
    xs = [m for m, _ in values]
    rolled = []
    for m, _ in values:
        lo, hi = bisect_left(xs, m - window / 2), bisect_right(xs, m + window / 2)
        rolled.append((m, float(np.percentile([v for _, v in values[lo:hi]], q))))
    inside = [abs(r - level) <= band * abs(level) for _, r in rolled]
    if not inside[-1]:
        return out
    k = len(inside)
    while k > 0 and inside[k - 1]:
        k -= 1
    start = rolled[k][0]
    out["from_min"] = round(start, 2) if start <= end * 2 / 3 else None  # level only if it held the last third
    return out


def levels(points: Sequence[Point], samples: Sequence[dict[str, Any]], end: float) -> dict[str, Any]:
    """:func:`level_off` of RocksDB memory (Spark's figure, per batch; its 90th percentile: the
    figure swings as memtables fill and flush), the state on disk and the memory of the JVM
    (RSS) and of the Python workers (PSS), sampled; in MB."""
    mb = 2 ** 20
    return {
        "rocksdb_memory_mb": level_off([(m, v / mb) for m, v in series(points, "state_memory_bytes")], end, q=90,
                                       window=2.5 * LEVEL_WINDOW_MIN),
        "state_disk_mb": level_off([(s["minute"], s["state_disk_bytes"] / mb) for s in samples], end),
        "jvm_rss_mb": level_off([(s["minute"], s["jvm_mb"]) for s in samples if "jvm_mb" in s], end),
        "python_workers_mb": level_off([(s["minute"], s["python_workers_mb"]) for s in samples
                                        if "python_workers_mb" in s], end),
    }


# --- the checkpoint and the output against the reference -------------------------------------------

def last_commit(checkpoint: Path) -> int | None:
    """The id of the last committed micro-batch of a checkpoint (``None``: none yet)."""
    ids = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if (checkpoint / "commits").is_dir() else []
    return max(ids) if ids else None


def batch_offsets(checkpoint: Path, batch: int) -> tuple[int, int]:
    """``(end index of the generator source, watermark ms)`` of a batch, from the offset log."""
    lines = [line for line in (checkpoint / "offsets" / str(batch)).read_text().splitlines() if line.strip()]
    meta = json.loads(lines[1])
    ends = {int(json.loads(line)["index"]) for line in lines[2:] if line.strip() not in ("-", "null")}
    if len(ends) != 1:
        raise RuntimeError(f"{checkpoint}: batch {batch} has source offsets {sorted(ends)}; expected one generator")
    return ends.pop(), int(meta.get("batchWatermarkMs", 0))


@dataclass
class StateSample:
    """The keys in state at one committed batch, read from the checkpoint while the job ran."""

    time: float
    batch: int
    end_index: int
    watermark_ms: int
    keys: set[str]
    seconds: float


def read_state_sample(spark: Any, checkpoint: Path) -> StateSample | None:
    import sparkstate as ss

    batch = last_commit(checkpoint)
    if batch is None:
        return None
    t0 = time.monotonic()
    end_index, watermark_ms = batch_offsets(checkpoint, batch)
    keys = {r[0] for r in ss.state.read(spark, str(checkpoint), batch).select("user_id").collect()}
    return StateSample(time.time(), batch, end_index, watermark_ms, keys, round(time.monotonic() - t0, 2))


def open_users_at(config: SoakConfig, marks: Sequence[tuple[int, int]]) -> list[set[str]]:
    """For each ``(end index, watermark ms)``: the users whose last session, in the valid records
    before that index, is still open at that watermark (by the reference's rules).

    Event-time sessionize keeps a user in state while any of its sessions is not final, and the
    final ones are always its earliest, so a user is in state exactly when its last session is
    not final: one ended by an ``is_last`` event is final once the watermark reaches that event,
    any other once the watermark is beyond its last event + gap (``reference_sessions``' rule).
    """
    from sparkstate.durations import instant_ms, positive_ms
    from sparkstate.synthetic import stream_records
    from sparkstate.io.sources import parse_source

    gen = parse_source(config.source).generator
    gap_ms = positive_ms(config.gap)
    order = sorted(range(len(marks)), key=lambda i: marks[i][0])
    out: list[set[str]] = [set() for _ in marks]
    last: dict[str, tuple[int, bool]] = {}
    pos = 0
    step = 50_000
    for i in order:
        end, watermark = marks[i]
        while pos < end:
            for r in stream_records(gen, pos, min(end, pos + step)):
                if r.is_valid:  # in event-time order: the soak's generator makes no late records
                    last[r.event.user_id] = (instant_ms(r.event.event_time), r.event.is_last)
            pos = min(end, pos + step)
        out[i] = {u for u, (t, is_last) in last.items() if (t > watermark if is_last else t + gap_ms >= watermark)}
    return out


def _first_deadline(state: dict[str, Any], gap_ms: int) -> int | None:
    """When a key's earliest open session becomes final, from its stored state: its end + gap, or
    just before its end when an ``is_last`` event ends it (the timeout sessionize must have set)."""
    sizes, times, closed = state.get("sizes") or [], state.get("times") or [], state.get("closed") or []
    if not sizes or not times:  # one session stored without per-event times
        return None if state.get("end_ms") is None else state["end_ms"] + gap_ms
    end = times[sizes[0] - 1]
    return end - 1 if closed and closed[0] else end + gap_ms


def verify_state_and_output(spark: Any, config: SoakConfig, checkpoint: Path, output: Path,
                            samples: Sequence[StateSample]) -> dict[str, Any]:
    """The ``expired_state`` and ``output_exact`` checks, and the figures behind them."""
    import sparkstate as ss
    from sparkstate.durations import positive_ms
    from sparkstate.synthetic import Session, reference_sessions, stream_records
    from sparkstate.io.sources import parse_source

    batch = last_commit(checkpoint)
    if batch is None:
        return {"checks": [Check("expired_state", False, "no committed micro-batch"),
                           Check("output_exact", False, "no committed micro-batch")]}
    end_index, watermark_ms = batch_offsets(checkpoint, batch)
    gap_ms = positive_ms(config.gap)
    stats = ss.state.stats(spark, str(checkpoint))
    final = {r["user_id"]: r for r in (row.asDict() for row in ss.state.read(spark, str(checkpoint), batch).collect())}
    marks = [(s.end_index, s.watermark_ms) for s in samples] + [(end_index, watermark_ms)]
    expected = open_users_at(config, marks)
    per_sample = []
    for s, want in zip(samples, expected):
        per_sample.append({"batch": s.batch, "keys": len(s.keys), "open_by_reference": len(want),
                           "left_over": len(s.keys - want), "missing": len(want - s.keys)})
    open_users = expected[-1]
    overdue = sorted(u for u, r in final.items() if r["timeout_ms"] is None or r["timeout_ms"] < watermark_ms)
    stale = sorted(set(final) - open_users)
    missing = sorted(open_users - set(final))
    not_end_gap = sorted(u for u, r in final.items() if _first_deadline(r, gap_ms) != r["timeout_ms"])
    bad_samples = [p for p in per_sample if p["left_over"] or p["missing"]]
    ok_state = not (overdue or stale or missing or not_end_gap or bad_samples) and stats.keys == len(final)

    gen = parse_source(config.source).generator
    events = [r.event for r in stream_records(gen, 0, end_index) if r.is_valid]
    want_sessions = Counter(reference_sessions(events, gap=config.gap, watermark=watermark_ms))
    rows = spark.read.parquet(str(output)).collect()
    got = Counter(Session.from_row(r) for r in rows)
    lost = sum((want_sessions - got).values())
    extra = sum((got - want_sessions).values())
    dup = sum(n - 1 for n in got.values() if n > 1)
    by = Counter(s.closed_by for s in got.elements())
    n_ref = sum(want_sessions.values())
    return {
        "last_batch": batch, "events_read": end_index, "valid_events": len(events),
        "watermark": dt.datetime.fromtimestamp(watermark_ms / 1000, dt.timezone.utc).isoformat(),
        "state_keys": len(final), "state_keys_stats": stats.keys, "state_keys_with_timeout": stats.keys_with_timeout,
        "state_bytes_on_disk": stats.bytes_on_disk, "open_sessions_reference": len(open_users),
        "left_over_after_expiry": stale[:20], "missing": missing[:20], "timeout_already_due": overdue[:20],
        "timeout_not_end_plus_gap": not_end_gap[:20],
        "state_samples_checked": len(per_sample), "state_samples_wrong": bad_samples[:20],
        "state_sample_keys_checked": sum(p["keys"] for p in per_sample) + len(final),
        "sessions_reference": n_ref, "sessions_output": len(rows), "sessions_by_closed_by": dict(by),
        "lost": lost, "duplicated": dup, "unexpected": extra - dup,
        "checks": [
            Check("expired_state", ok_state,
                  f"{len(per_sample)} samples during the run and the end (batch {batch}): keys in state = users"
                  f" with an open session by the reference at that batch in {len(per_sample) - len(bad_samples)}"
                  f"/{len(per_sample)} samples; at the end {len(final)} keys (stats: {stats.keys}) for"
                  f" {len(open_users)} open sessions, left over after expiry {len(stale)}, missing {len(missing)},"
                  f" timeout already due {len(overdue)}, timeout not at the first open session's deadline {len(not_end_gap)};"
                  f" {n_ref:,} sessions closed by {config.users} users"),
            Check("output_exact", lost == 0 and extra == 0,
                  f"{len(rows):,} sessions in the sink, reference {n_ref:,}: lost {lost}, duplicated {dup},"
                  f" unexpected {extra - dup}"),
        ],
    }


# --- the run -----------------------------------------------------------------------------------

def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:  # removed by Spark's maintenance meanwhile
                pass
    return total


def _tree_mb() -> dict[str, float]:
    return {f"{g}_mb": round(kb / 1024, 1) for g, kb in TreeSampler().current_kb().items()}


class Sampler(SamplingLoop):
    """Every ``every`` seconds: load average, the checkpoint's state bytes on disk, process memory."""

    def __init__(self, checkpoint: Path, path: Path, every: float) -> None:
        super().__init__("soak-sampler")
        self.checkpoint, self.path, self.every = checkpoint, path, every
        self.samples: list[dict[str, Any]] = []

    def interval(self) -> float:
        return self.every

    def sample(self) -> None:
        s = {"time": time.time(), "load1": round(os.getloadavg()[0], 2),
             "state_disk_bytes": _dir_bytes(self.checkpoint / "state"),
             "checkpoint_bytes": _dir_bytes(self.checkpoint)} | _tree_mb()
        self.samples.append(s)
        with open(self.path, "a") as f:
            f.write(json.dumps(s) + "\n")


class StateSampler(SamplingLoop):
    """At random intervals averaging ``every`` seconds: the keys in state at the last committed batch."""

    def __init__(self, spark: Any, checkpoint: Path, path: Path, every: float, seed: int) -> None:
        super().__init__("soak-state-sampler")
        self.spark, self.checkpoint, self.path, self.every = spark, checkpoint, path, every
        self.rng = random.Random(seed)
        self.samples: list[StateSample] = []
        self.errors: list[str] = []

    def interval(self) -> float:
        return self.every * self.rng.uniform(0.5, 1.5)

    def sample(self) -> None:
        try:
            s = read_state_sample(self.spark, self.checkpoint)
        except Exception as exc:  # e.g. the batch's files cleaned up meanwhile: note it, go on
            self.errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc) else ''}")
            return
        if s is None or (self.samples and self.samples[-1].batch == s.batch):
            return
        self.samples.append(s)
        with open(self.path, "a") as f:
            f.write(json.dumps({"time": s.time, "batch": s.batch, "end_index": s.end_index,
                                "watermark_ms": s.watermark_ms, "keys": len(s.keys), "read_s": s.seconds}) + "\n")


def _store_listener(path: Path) -> Any:
    """A listener writing, per batch of the soak's query, the state operators' RocksDB figures
    (``memoryUsedBytes`` and the ``customMetrics``: SST file size, pinned blocks, ...), which the
    metrics file does not keep: they tell a cache warming up from state that piles up."""
    from sparkstate.observe.listener import JsonProgressListener

    class StoreListener(JsonProgressListener):  # reports as JSON: one JVM call each
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            try:
                p = json.loads(event.progress.json)
                if p.get("name") != QUERY_NAME:
                    return
                ops = p.get("stateOperators") or []
                custom: dict[str, float] = {}
                for op in ops:
                    for k, v in (op.get("customMetrics") or {}).items():
                        if isinstance(v, (int, float)):
                            custom[k] = custom.get(k, 0) + v
                rec = {"batch": p.get("batchId"), "time": p.get("timestamp"),
                       "memory_used_bytes": sum(op.get("memoryUsedBytes") or 0 for op in ops),
                       "rows_total": sum(op.get("numRowsTotal") or 0 for op in ops), "custom": custom}
                with open(path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            except Exception:  # never disturb the query
                pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return StoreListener()


def _store_summary(path: Path) -> dict[str, Any]:
    """First, middle and last batch's RocksDB figures from :func:`_store_listener`'s file."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    recs = [r for r in recs if r.get("rows_total")]
    keys = ("rocksdbSstFileSize", "rocksdbPinnedBlocksMemoryUsage", "rocksdbNumSnapshotFilesUploaded",
            "rocksdbFilesCopied", "rocksdbZipFileBytesUncompressed")
    out = {}
    for name, r in (("first", recs[:1]), ("middle", recs[len(recs) // 2: len(recs) // 2 + 1]), ("last", recs[-1:])):
        if r:
            out[name] = {"batch": r[0]["batch"], "memory_used_bytes": r[0]["memory_used_bytes"]} | {
                k: r[0]["custom"].get(k) for k in keys if k in r[0]["custom"]}
    return out


#: Start-up attempts of the job: on a machine loaded far beyond its cores, the Python process of
#: a Python data source (the generator) can take longer than the 10 seconds Spark waits for it to
#: connect back (a constant in PySpark 4.3's PythonWorkerFactory), and the query fails before its
#: first batch. Only that failure, before any batch, is retried; the checkpoint is still empty.
STARTUP_ATTEMPTS = 6


def run_job(spark: Any, job: Any, on_batch: Callable[[Any, Any], None], log: Callable[[str], None]) -> Any:
    """:func:`~sparkstate.jobs.run_pipeline`, retried (:data:`STARTUP_ATTEMPTS`) when it failed to start."""
    from sparkstate.errors import JobFailedError
    from sparkstate.jobs import run_pipeline

    seen = [0]

    def counting(m: Any, totals: Any) -> None:
        seen[0] += 1
        on_batch(m, totals)

    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        try:
            return run_pipeline(spark, job, on_batch=counting)
        except JobFailedError as exc:
            if seen[0] or attempt == STARTUP_ATTEMPTS or "failed to connect back" not in str(exc):
                raise
            log(f"  the job failed to start ({exc}); attempt {attempt + 1} of {STARTUP_ATTEMPTS}")
    raise AssertionError("unreachable")


def _stop_job(spark: Any, name: str) -> None:
    """Stop the job's queries, each after its running micro-batch has committed."""
    from sparkstate.jobs.control import stop_after_current_batch

    for q in [q for q in spark.streams.active if (q.name or "").startswith(name)]:
        try:
            stop_after_current_batch(q)
        except Exception:  # already stopping; run_pipeline reports a failed query itself
            pass


def _parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def load_points(metrics: Path) -> tuple[list[Point], float]:
    """The output query's batches of a metrics file as :class:`Point` s, and the first batch's start (epoch s)."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    recs = [r for r in recs if r.get("query", "output") == "output" and r.get("time")]
    recs.sort(key=lambda r: r["batch_id"])
    t0 = _parse_time(recs[0]["time"]) if recs else time.time()

    def num(r: dict, k: str) -> float | None:
        return None if r.get(k) is None else float(r[k])

    pts = [Point(round((_parse_time(r["time"]) - t0) / 60, 4), num(r, "batch_duration_ms"), num(r, "state_rows"),
                 num(r, "state_memory_bytes"), int(r.get("rows_in") or 0), int(r.get("rows_out") or 0))
           for r in recs]
    return pts, t0


@dataclass
class SoakResult:
    ok: bool
    summary: dict[str, Any]
    checks: list[Check]
    out: Path
    images: list[Path] = field(default_factory=list)


def run_soak(spark: Any, config: SoakConfig, out: Path, tolerances: Tolerances = Tolerances(),
             work: Path | None = None, log: Callable[[str], None] = lambda s: None) -> SoakResult:
    """Run the job for ``config.minutes``, then analyse it; everything lands in ``out``.

    ``work`` holds the checkpoint and the sink (a temporary directory, removed, when not given).
    ``log`` receives a progress line about every 30 seconds.
    """
    from sparkstate.jobs import JobConfig

    out.mkdir(parents=True, exist_ok=True)
    metrics, samples_path, state_path = out / "metrics.jsonl", out / "samples.jsonl", out / "state_samples.jsonl"
    for p in (metrics, samples_path, state_path):
        p.unlink(missing_ok=True)
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="sparkstate-soak-")
        work = Path(tmp.name)
    try:
        ck, sink = work / "checkpoint", work / "sessions"
        extra = {} if config.engine is None else {"engine": config.engine}
        job = JobConfig("sessionize", source=config.source, sink=f"parquet:{sink}", checkpoint=str(ck),
                        gap=config.gap, time_mode="event", watermark=config.watermark, trigger=config.trigger,
                        metrics=str(metrics), query_name=QUERY_NAME, **extra)
        retained = int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", str(RETAINED_BATCHES)))
        bounded = spark.conf.get(f"{ROCKSDB}.boundedMemoryUsage", "false").lower() == "true"
        bound_mb = float(spark.conf.get(f"{ROCKSDB}.maxMemoryUsageMB", "500")) if bounded else None
        started = time.monotonic()
        shown = [started]
        first_batch, done, batches = threading.Event(), threading.Event(), [0]

        def clock() -> None:
            """Stop the job ``minutes`` after its first batch (and ``min_batches`` batches), at most ``max_minutes``."""
            if not first_batch.wait(STARTUP_LIMIT_S):
                if not done.is_set():
                    log(f"  no micro-batch completed within {STARTUP_LIMIT_S:.0f} s; stopping")
                    _stop_job(spark, QUERY_NAME)
                return
            t1 = time.monotonic()
            limit = 60 * (config.max_minutes if config.max_minutes is not None else 3 * config.minutes)
            while not done.wait(0.5):
                elapsed = time.monotonic() - t1
                if (elapsed >= 60 * config.minutes and batches[0] >= config.min_batches) or elapsed >= limit:
                    _stop_job(spark, QUERY_NAME)
                    return

        stopper = threading.Thread(target=clock, name="soak-clock", daemon=True)

        def on_batch(m: Any, totals: Any) -> None:
            if m.query != "output":
                return
            batches[0] += 1
            first_batch.set()  # the clock runs from the end of the first micro-batch (start-up excluded)
            if time.monotonic() - shown[0] >= 30:
                shown[0] = time.monotonic()
                keys = state_sampler.samples[-1] if state_sampler.samples else None
                log(f"  {(shown[0] - started) / 60:5.1f} min  batch {m.batch_id:>4}  events {totals.rows_in:>9,}"
                    f"  sessions {totals.rows_out or 0:>8,}  keys in state"
                    f" {'?' if keys is None else len(keys.keys)} (batch {'-' if keys is None else keys.batch})"
                    f"  batch {m.batch_duration_ms} ms  load {os.getloadavg()[0]:.2f}")

        load_start = load_average()
        sampler = Sampler(ck, samples_path, config.sample_every_s)
        state_sampler = StateSampler(spark, ck, state_path, config.state_every_s, config.seed)
        store_path = out / "state_store.jsonl"
        store_path.unlink(missing_ok=True)
        store_listener = _store_listener(store_path)
        spark.streams.addListener(store_listener)
        with sampler, state_sampler:
            stopper.start()
            try:
                result = run_job(spark, job, on_batch, log)
            finally:
                done.set()
                stopper.join()
                spark.streams.removeListener(store_listener)
        seconds = round(time.monotonic() - started, 1)
        load_end = load_average()
        log(f"  stopped after {seconds:.0f} s ({result.batches} batches); checking the checkpoint and the output")
        points, t0 = load_points(metrics)
        states = [s for s in state_sampler.samples if s.time >= t0]
        keys = [(round((s.time - t0) / 60, 4), float(len(s.keys))) for s in states]
        samples = [s | {"minute": round((s["time"] - t0) / 60, 4)} for s in sampler.samples]
        disk = [(s["minute"], float(s["state_disk_bytes"])) for s in samples if s["minute"] >= 0]
        analysis = analyse(points, keys, disk, config.rate, tolerances, retained, bound_mb)
        # The last sample may be of the final batch; the end is checked on its own below.
        verified = verify_state_and_output(spark, config, ck, sink, states)
        checks = analysis["checks"] + verified.pop("checks")
        end = points[-1].minute if points else 0.0
        for t, part in zip(analysis["thirds"], _split(samples, lambda s: s["minute"], end)):
            loads = [s["load1"] for s in part]
            t["load1_mean"] = round(statistics.fmean(loads), 2) if loads else None
            t["state_disk_mb_mean"] = round(statistics.fmean(s["state_disk_bytes"] for s in part) / 1e6, 3) \
                if part else None

        def keys_at(minute: float) -> float | None:
            near = min(keys, key=lambda k: abs(k[0] - minute), default=None)
            return None if near is None else near[1]

        summary = {
            "config": asdict(config), "source": config.source, "engine": config.engine or "(pipeline default)",
            "tolerances": asdict(tolerances), "seconds": seconds, "minutes_of_batches": round(end, 2),
            "batches": len(points), "events": sum(p.rows_in for p in points),
            "events_per_s": None if not end else round(sum(p.rows_in for p in points) / (end * 60), 1),
            "sessions_emitted": sum(p.rows_out for p in points), "dead_letters": result.dead_letters,
            "sessions_timed_out": result.timed_out,
            "state_keys_at": {"start": keys_at(0.0), "middle": keys_at(end / 2), "end": keys_at(end),
                              "final": verified.get("state_keys")},
            "state_keys_max": max((v for _, v in keys), default=None),
            "state_samples": len(states), "state_sample_errors": state_sampler.errors[:10],
            "state_sample_read_s_median": _median([s.seconds for s in states]),
            "state_rows_at": {"start": points[0].state_rows if points else None,
                              "end": points[-1].state_rows if points else None},
            "retained_batches": retained, "rocksdb_memory_bound_mb": bound_mb,
            "state_store": _store_summary(store_path),
            "process_mb_peak": {k: max(s[k] for s in samples) for k in samples[0] if k.endswith("_mb")},
            "load_average": {"start": load_start, "end": load_end,
                             "mean_1min": round(statistics.fmean(s["load1"] for s in samples), 2)},
            "levels": levels(points, samples, end) if points else {},
            "thirds": analysis["thirds"], "second_half": analysis["second_half"], "verify": verified,
            "checks": [asdict(c) for c in checks], "ok": all(c.ok for c in checks),
        }
        images = plot(points, samples, keys, summary, out) if points else []
        try:
            from sparkstate.observe.report import write_report

            write_report(metrics, out / "report")
        except Exception as exc:  # the soak's own plots are there; the generic report is a bonus
            summary["report_error"] = str(exc)
        (out / "soak.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return SoakResult(summary["ok"], summary, checks, out, images)
    finally:
        if tmp is not None:
            tmp.cleanup()


# --- plots -------------------------------------------------------------------------------------

def _rolling_median(ys: list[float], n: int) -> list[float]:
    half = n // 2
    return [statistics.median(ys[max(0, i - half): i + half + 1]) for i in range(len(ys))]


def plot(points: Sequence[Point], samples: list[dict[str, Any]], keys: Series, summary: dict[str, Any],
         out: Path) -> list[Path]:
    """Three small PNGs: batch duration (with load), state (keys, store rows, memory, disk), events and memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = points[-1].minute
    samples = [s for s in samples if s["minute"] >= 0]  # from the first batch's start on, like the batches
    cfg = summary["config"]
    title = f"{cfg['rate']:g} events/s, {cfg['users']} users, gap {cfg['gap']}, {end:.1f} min"

    def frame(ax: Any) -> None:
        for k in (1, 2):
            ax.axvline(k * end / 3, color="grey", linewidth=0.6, linestyle=":")
        ax.axvspan(0, end / 3, color="grey", alpha=0.08)
        ax.set_xlim(0, end * 1.01)
        ax.set_xlabel("minutes (shaded: warm-up third)")
        ax.grid(alpha=0.25)

    def fit_line(ax: Any, values: Series, drift: dict[str, Any], color: str = "black") -> None:
        half = [(m, v) for m, v in values if m >= end / 2]
        if len(half) >= 3:
            xs = np.array([m for m, _ in half])
            b, a = np.polyfit(xs, np.array([v for _, v in half]), 1)
            ax.plot(xs, a + b * xs, color=color, linewidth=1.6,
                    label=f"fit, 2nd half: {_pct_text(drift.get('relative_drift'))} over it")

    def legend(ax: Any, ax2: Any, loc: str, ncol: int = 1) -> None:
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc=loc, ncol=ncol, framealpha=0.85)

    second = summary["second_half"]
    images = []
    # 1. batch duration and load
    fig, ax = plt.subplots(figsize=(7, 3.2))
    dur = series(points, "duration_ms")
    ys = [v for _, v in dur]
    ax.plot([m for m, _ in dur], ys, ".", markersize=2.5, color="tab:blue", alpha=0.45, label="batch duration")
    ax.plot([m for m, _ in dur], _rolling_median(ys, 15), color="tab:blue", linewidth=1.2,
            label="rolling median (15 batches)")
    fit_line(ax, dur, second.get("batch_duration_ms", {}))
    ax.set_ylabel("ms")
    ax.set_ylim(0, (_pct(ys, 99) or 1) * 1.4)
    ax2 = ax.twinx()
    loads = [s["load1"] for s in samples]
    ax2.plot([s["minute"] for s in samples], loads, color="tab:red", linewidth=0.9, linestyle="--",
             label="load average (1 min)")
    ax2.set_ylabel("load average (2 cores)" if os.cpu_count() == 2 else "load average", color="tab:red")
    ax2.set_ylim(0, max(loads + [1]) * 1.6)
    frame(ax)
    ax.set_title(f"Batch duration - {title}", fontsize=9)
    legend(ax, ax2, "upper right")
    images.append(_save(fig, out / "soak_batch_duration.png"))
    # 2. state
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([m for m, _ in keys], [v for _, v in keys], "o-", markersize=3, linewidth=0.8, color="tab:green",
            label="keys in state (checkpoint)")
    fit_line(ax, keys, second.get("state_keys", {}), color="darkgreen")
    rows = series(points, "state_rows")
    ax.plot([m for m, _ in rows], [v for _, v in rows], color="tab:cyan", linewidth=0.8,
            label="state store rows (metrics)")
    ax.axhline(cfg["users"], color="tab:green", linestyle=":", linewidth=1, label=f"users ({cfg['users']})")
    ax.set_ylabel("keys")
    ax.set_ylim(0, cfg["users"] * 1.35)
    ax2 = ax.twinx()
    mem = series(points, "state_memory_bytes")
    ax2.plot([m for m, _ in mem], [v / 1e6 for _, v in mem], color="tab:purple", linewidth=0.9, linestyle="--",
             label="RocksDB memory (MB)")
    ax2.plot([s["minute"] for s in samples], [s["state_disk_bytes"] / 1e6 for s in samples], color="tab:brown",
             linewidth=1, linestyle="-.", label="state on disk (MB)")
    ax2.set_ylabel("MB")
    top = max([v / 1e6 for _, v in mem] + [s["state_disk_bytes"] / 1e6 for s in samples] + [0.1])
    ax2.set_ylim(0, top * 1.35)
    frame(ax)
    ax.set_title(f"State - {title}", fontsize=9)
    legend(ax, ax2, "upper left", ncol=3)
    images.append(_save(fig, out / "soak_state.png"))
    # 3. events read against the rate, and process memory
    fig, ax = plt.subplots(figsize=(7, 3.2))
    cum, total = [], 0
    for p in points:  # a batch reads the events offered until it begins
        total += p.rows_in
        cum.append(total / 1000)
    ax.plot([p.minute for p in points], cum, color="tab:blue", linewidth=1.4, label="events read (thousands)")
    first = next((i for i, p in enumerate(points) if p.rows_in), 0)
    x0 = points[first].minute
    ax.plot([x0, end], [cum[first], cum[first] + cfg["rate"] * (end - x0) * 60 / 1000], color="black",
            linestyle=":", linewidth=1, label=f"at the rate ({cfg['rate']:g}/s)")
    ax.set_ylabel("thousand events")
    ax.set_ylim(0, None)
    ax2 = ax.twinx()
    for key, color, label in (("jvm_mb", "tab:orange", "JVM (MB)"), ("python_workers_mb", "tab:olive",
                                                                    "Python workers (MB)")):
        ax2.plot([s["minute"] for s in samples], [s[key] for s in samples], color=color, linewidth=1,
                 linestyle="--", label=label)
    ax2.set_ylabel("memory (MB): PSS, JVM RSS")
    ax2.set_ylim(0, max([s["jvm_mb"] for s in samples] + [s["python_workers_mb"] for s in samples] + [1]) * 1.3)
    frame(ax)
    ax.set_title(f"Events read and process memory - {title}", fontsize=9)
    legend(ax, ax2, "upper left", ncol=2)
    images.append(_save(fig, out / "soak_resources.png"))
    if summary.get("levels"):
        images.append(plot_levels(points, samples, summary, out / "soak_levels.png"))
    return images


def plot_levels(points: Sequence[Point], samples: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> Path:
    """One figure, three panels: RocksDB memory against its bound, the state on disk, and the
    memory of the JVM and the Python workers, each with the level it settled at (:func:`levels`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = points[-1].minute
    lv = summary["levels"]
    cfg = summary["config"]
    samples = [s for s in samples if s["minute"] >= 0]
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 7.2), sharex=True)

    def mark(ax: Any, info: dict[str, Any], color: str, label: str) -> None:
        if info.get("level") is None:
            return
        start = info.get("from_min")
        text = f"{label} level {info['level']:,.1f} MB" + (f", from minute {start:.1f}" if start is not None
                                                            else " (not level yet)")
        ax.hlines(info["level"], start if start is not None else 2 * end / 3, end, color=color, linewidth=2.2,
                  alpha=0.5, label=text)
        if start is not None:
            ax.axvline(start, color=color, linestyle=":", linewidth=1)

    ax = axes[0]
    mem = series(points, "state_memory_bytes")
    ax.plot([m for m, _ in mem], [v / 2 ** 20 for _, v in mem], color="tab:purple", linewidth=0.9,
            label="RocksDB memory (Spark's memoryUsedBytes, all state stores)")
    bound = summary.get("rocksdb_memory_bound_mb")
    if bound:
        ax.axhline(bound, color="black", linestyle="--", linewidth=0.9, label=f"bound: maxMemoryUsageMB = {bound:g}")
    mark(ax, lv["rocksdb_memory_mb"], "tab:purple", "RocksDB")
    ax.set_ylabel("MB")
    ax.set_ylim(0, max([v / 2 ** 20 for _, v in mem] + [bound or 0, 0.1]) * 1.45)
    ax = axes[1]
    ax.plot([s["minute"] for s in samples], [s["state_disk_bytes"] / 2 ** 20 for s in samples], color="tab:brown",
            linewidth=0.9, label="state on disk (checkpoint's state/)")
    mark(ax, lv["state_disk_mb"], "tab:brown", "disk")
    ax.set_ylabel("MB")
    ax.set_ylim(0, max([s["state_disk_bytes"] / 2 ** 20 for s in samples] + [0.1]) * 1.45)
    ax = axes[2]
    for key, color, label in (("jvm_mb", "tab:orange", "JVM (RSS)"), ("python_workers_mb", "tab:olive",
                                                                      "Python workers (PSS)")):
        ax.plot([s["minute"] for s in samples], [s[key] for s in samples], color=color, linewidth=0.9, label=label)
    mark(ax, lv["jvm_rss_mb"], "tab:orange", "JVM")
    mark(ax, lv["python_workers_mb"], "tab:olive", "workers")
    ax.set_ylabel("MB")
    ax.set_ylim(0, max([s["jvm_mb"] for s in samples] + [s["python_workers_mb"] for s in samples] + [1]) * 1.45)
    for ax in axes:
        ax.set_xlim(0, end * 1.01)
        ax.grid(alpha=0.25)
        ax.legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.85)
    axes[-1].set_xlabel("minutes since the first micro-batch")
    axes[0].set_title(f"Where memory and disk level off - {cfg['rate']:g} events/s, {cfg['users']} users,"
                      f" {end:.0f} min, {summary['batches']} batches", fontsize=9)
    return _save(fig, path)


def relevel(out: Path) -> dict[str, Any]:
    """Recompute :func:`levels` and the plots of a finished run from its files in ``out``
    (``metrics.jsonl``, ``samples.jsonl``, ``state_samples.jsonl``, ``soak.json``), e.g. a run
    made before :func:`levels` existed; ``soak.json`` gets the ``levels``."""
    summary = json.loads((out / "soak.json").read_text())
    points, t0 = load_points(out / "metrics.jsonl")
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]
    samples = [s | {"minute": round((s["time"] - t0) / 60, 4)} for s in samples]
    states = [json.loads(line) for line in (out / "state_samples.jsonl").read_text().splitlines() if line.strip()]
    keys = [(round((s["time"] - t0) / 60, 4), float(s["keys"])) for s in states if s["time"] >= t0]
    summary["levels"] = levels(points, samples, points[-1].minute)
    plot(points, samples, keys, summary, out)
    (out / "soak.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary["levels"]


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# --- command line ------------------------------------------------------------------------------

#: Named sets of settings (``--preset NAME``; flags given beside it win). ``long``: the soak at
#: :func:`sparkstate.spark_session`'s own RocksDB bound (64 MB), with state large enough to fill it
#: within minutes: 50,000 users at 2,000 events/s for 30 minutes (``make soak SOAK=long``). Give it a
#: quiet machine: on a shared one the batch-time check measures the neighbours.
PRESETS: dict[str, dict[str, Any]] = {
    "long": {"minutes": 30.0, "rate": 2000.0, "users": 50_000, "rocksdb_memory_mb": 0, "state_every": 120.0},
}


def parser() -> argparse.ArgumentParser:
    d = SoakConfig()
    t = Tolerances()
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description="Soak run: sessionize on the generator at a fixed rate for a bounded time; checks that batch"
                    " duration and state stay flat and that expired state goes away (exit 1 if not).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named set of the settings below (flags given beside"
                   " it win): long = " + " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in PRESETS["long"].items()))
    p.add_argument("--minutes", type=float, default=d.minutes, help="how long the job runs after its first batch")
    p.add_argument("--rate", type=float, default=d.rate, help="generator events per second")
    p.add_argument("--users", type=int, default=d.users, help="generator users (= keys)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--gap", default=d.gap, help="session gap (the generator's and the pipeline's)")
    p.add_argument("--watermark", default=d.watermark, help="watermark delay")
    p.add_argument("--trigger", default=d.trigger, help="processing-time trigger")
    p.add_argument("--engine", default=d.engine, help="state engine (default: the pipeline's)")
    p.add_argument("--min-batches", type=int, default=d.min_batches,
                   help="run past --minutes until this many micro-batches completed (at most 3 x --minutes)")
    p.add_argument("--sample-every", type=float, default=d.sample_every_s,
                   help="seconds between samples of memory, disk and load")
    p.add_argument("--state-every", type=float, default=d.state_every_s,
                   help="mean seconds between reads of the keys in state from the checkpoint")
    p.add_argument("--state-tolerance", type=float, default=t.state, help="share the state may move")
    p.add_argument("--duration-tolerance", type=float, default=t.duration, help="share batch duration may grow")
    p.add_argument("--rate-tolerance", type=float, default=t.rate, help="share the read rate may fall below --rate")
    p.add_argument("--rocksdb-memory-mb", type=int, default=SOAK_ROCKSDB_MEMORY_MB,
                   help="RocksDB's memory bound for the run (maxMemoryUsageMB; 0: spark_session()'s default)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra Spark setting (repeatable)")
    p.add_argument("--out", type=Path, help="results directory (default: benchmarks/results/soak-STAMP)")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint and the sink in OUT/work")
    p.add_argument("--levels", type=Path, metavar="OUT", help="only recompute where memory and disk level off, and"
                   " the plots, of the finished run in OUT (no new run)")
    return p


def _table(summary: dict[str, Any]) -> str:
    rows = ["| third | minutes | batches | events/s | p50 ms | p95 ms | keys in state: mean (min-max) | load |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, t in zip(("warm-up", "middle", "last"), summary["thirds"]):
        keys = "-" if t["state_keys_mean"] is None else \
            f"{t['state_keys_mean']:.0f} ({t['state_keys_min']:.0f}-{t['state_keys_max']:.0f})"
        rows.append(f"| {name} | {t['from_min']:.1f}-{t['to_min']:.1f} | {t['batches']} | {t['events_per_s']} |"
                    f" {t['p50_ms']:.0f} | {t['p95_ms']:.0f} | {keys} | {t['load1_mean']} |")
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, a ``--preset``'s settings under the flags given.

    >>> a = parse_args(["--preset", "long", "--minutes", "5"])
    >>> a.minutes, a.users, a.rate, a.rocksdb_memory_mb
    (5.0, 50000, 2000.0, 0)
    """
    p = parser()
    preset = p.parse_args(argv).preset
    if preset is not None:
        p.set_defaults(**PRESETS[preset])
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from .run import machine, spark_output_to
    from .runner import start_session

    args = parse_args(argv)
    if args.levels is not None:
        print(json.dumps(relevel(args.levels), indent=2))
        return 0
    if any("=" not in c for c in args.conf):
        print("--conf takes KEY=VALUE", file=sys.stderr)
        return 2
    if args.minutes <= 0 or args.rate <= 0 or args.users < 1:
        print("--minutes and --rate must be positive, --users at least 1", file=sys.stderr)
        return 2
    config = SoakConfig(args.minutes, args.rate, args.users, args.seed, args.gap, args.watermark, args.trigger,
                        args.engine, args.min_batches, None, args.sample_every, args.state_every)
    tol = Tolerances(args.state_tolerance, args.duration_tolerance, args.rate_tolerance)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("benchmarks/results") / f"soak-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work" if args.keep else None
    if work is not None and work.exists():
        shutil.rmtree(work)
    print(f"sparkstate soak: sessionize on {config.source} for {config.minutes:g} min; load {load_average()};"
          f" results in {out}")
    with spark_output_to(out / "spark.log") as console:
        def say(line: str) -> None:
            print(line, file=console, flush=True)

        conf = {f"{ROCKSDB}.maxMemoryUsageMB": str(args.rocksdb_memory_mb)} if args.rocksdb_memory_mb else {}
        conf.update(dict(c.split("=", 1) for c in args.conf))
        spark = start_session(None, conf)
        try:
            result = run_soak(spark, config, out, tol, work=work, log=say)
        finally:
            spark.stop()
    s = result.summary
    s["spark_conf"] = conf
    s["machine"], s["command"] = machine(), ["python", "-m", "benchmarks.soak", *(argv or sys.argv[1:])]
    (out / "soak.json").write_text(json.dumps(s, indent=2, default=str) + "\n")
    v = s["verify"]
    print(f"\n{s['minutes_of_batches']:.1f} min of batches ({s['seconds']:.0f} s in all), {s['batches']} batches,"
          f" {s['events']:,} events ({s['events_per_s']}/s), {s['sessions_emitted']:,} sessions emitted;"
          f" keys in state start/middle/end {s['state_keys_at']['start']}/{s['state_keys_at']['middle']}/"
          f"{s['state_keys_at']['end']} of {config.users} users ({s['state_samples']} samples);"
          f" load average {s['load_average']['mean_1min']} on {os.cpu_count()} cores\n")
    if s["thirds"]:
        print(_table(s))
    if "state_keys" in v:
        print(f"\nend state: {v['state_keys']} keys = {v['open_sessions_reference']} open sessions by the reference;"
              f" output: {v['sessions_output']:,} sessions, lost {v['lost']}, duplicated {v['duplicated']}\n")
    for name, info in (s.get("levels") or {}).items():
        print(f"  level  {name:<18} {info['level']} MB (p{info['percentile']:g} by third {info['thirds']},"
              f" max {info['max']:.1f}),"
              f" {'level from minute ' + str(info['from_min']) if info['from_min'] is not None else 'not level'}")
    for c in result.checks:
        print(f"  {'ok  ' if c.ok else 'FAIL'} {c.name:<15} {c.detail}")
    print(f"\nJSON: {out / 'soak.json'}\nplots: {', '.join(str(p) for p in result.images)}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
