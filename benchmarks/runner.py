"""Run one contender: one streaming query, timed from ``start()`` to its end, and measured.

A :class:`Task` says which contender on which input; :func:`execute` runs it in a SparkSession
made by :func:`start_session` and returns a JSON-able result. ``python -m benchmarks.runner
TASK.json RESULT.json`` does the same in a fresh process (one JVM per contender), which is how
``benchmarks.run`` isolates contenders by default.

The query reads the input files ``files_per_trigger`` at a time with ``trigger(availableNow=True)``
and writes to the ``noop`` sink, so it ends by itself once the input is processed (event-time
queries go idle after their last no-data batch). The clock runs from ``start()`` to the return
of ``awaitTermination()``; starting the SparkSession is not timed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from .measure import TreeSampler, load_average, state_size, summarize_batches

ROOT = Path(__file__).resolve().parent.parent
MASTER = "local[2]"


def bench_config(jar: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings every contender shares, on top of ``sparkstate.spark.default_config()``
    (RocksDB, changelog checkpointing, UTC)."""
    cfg = {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.streaming.numRecentProgressUpdates": "100000",
    }
    if jar:
        cfg["spark.driver.extraClassPath"] = jar
    cfg.update(extra or {})
    return cfg


def start_session(jar: str | None, extra: Mapping[str, str] | None = None):
    """A local[2] SparkSession for the benchmark; workers can import ``benchmarks``."""
    paths = [str(ROOT), str(ROOT / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    import sparkstate as ss

    return ss.spark_session("sparkstate-bench", master=MASTER, config=bench_config(jar, extra))


@dataclass(frozen=True)
class Task:
    """One contender on one input (JSON-able, handed to a child process as is)."""

    contender: str
    workload: str  # count | sessions | scaling
    params: dict  # the Workload / Scaling fields
    source: str  # the directory the stream reads
    files_per_trigger: int
    workdir: str  # checkpoints go under it (removed after the run)
    timeout_s: float = 3600.0
    jar: str | None = None
    conf: dict | None = None
    #: Collect the output (foreachBatch instead of noop) and fingerprint it; slower, for checks.
    verify: bool = False
    #: Scaling run: the input that preloads the state by its first micro-batches (``source`` has
    #: the touched batches only, for a contender that preloads through an initial state).
    preload_source: str | None = None
    #: Scaling run: ``auto`` (an initial state where the contender takes one, else batches) or ``batches``.
    preload: str = "auto"

    def spec(self):
        from .data import Scaling, Workload

        cls = Scaling if self.workload == "scaling" else Workload
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in self.params.items() if k in names})


def find_contender(task: Task):
    from .contenders import contenders

    kind = "count" if task.workload == "scaling" else task.workload
    for c in contenders(kind):
        if c.name == task.contender:
            return c
    raise LookupError(f"no contender {task.contender!r} for workload {kind!r}")


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:6])[:1200]


def fingerprint(workload: str, rows: list) -> tuple[str, int]:
    """A digest of the output that every correct contender of ``workload`` shares.

    Running count: the last count of each key (update mode emits every intermediate one).
    Sessions: the sorted session rows.
    """
    if workload in ("count", "scaling"):
        final: dict = {}
        for key, n in rows:
            final[key] = max(final.get(key, 0), n)
        items: list = sorted(final.items())
    else:
        items = sorted((r[0], str(r[1]), str(r[2]), r[3], tuple(r[4]), r[5]) for r in rows)
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16], len(items)


def _scaling_output(contender: Any, ctx: Any, task: Task, result: dict) -> tuple[Any, int]:
    """The scaling run's output and how many first micro-batches preload the state: an initial
    state where the contender takes one (and ``task.preload`` allows), else every key read once
    by the first ``preload_batches`` micro-batches (an engine that refuses an initial state on
    this minor lands here, its sentence in ``preload_refused``)."""
    from sparkstate.errors import SparkStateError

    from .contenders import initial_counts
    from .data import read_stream

    spark, spec = ctx.spark, ctx.workload
    if contender.build_initial is not None and task.preload != "batches":
        df = read_stream(spark, spec.schema, Path(task.source), 1)
        try:
            out = contender.build_initial(ctx, df, initial_counts(spark, spec))
            result["preload"] = "initial state"
            return out, 1
        except SparkStateError as exc:
            result["preload_refused"] = _error_text(exc)
    if task.preload_source is None:
        raise ValueError("a scaling task needs its preload input (preload_source)")
    df = read_stream(spark, spec.schema, Path(task.preload_source), 1)
    result["preload"] = "first batch" if spec.preload_batches == 1 else f"first {spec.preload_batches} batches"
    return contender.build(ctx, df), spec.preload_batches


def execute(spark: Any, task: Task) -> dict:
    """Run ``task`` in ``spark`` and return its measurements (``error`` set if it failed)."""
    from .contenders import Context
    from .data import read_stream

    contender = find_contender(task)
    spec = task.spec()
    ctx = Context(spark, spec)
    result: dict[str, Any] = {
        "contender": contender.name, "family": contender.family, "description": contender.description,
        "reference": contender.reference, "workload": task.workload, "params": spec.as_dict(),
        "label": spec.label(), "conf": dict(contender.conf), "error": None,
    }
    saved = {k: spark.conf.get(k, None) for k in contender.conf}
    checkpoint = Path(task.workdir) / f"{contender.name}-{uuid.uuid4().hex[:8]}"
    query = None
    try:
        for k, v in contender.conf.items():
            spark.conf.set(k, v)
        warmup = 1
        if task.workload == "scaling":
            out, warmup = _scaling_output(contender, ctx, task, result)
        else:
            out = contender.build(ctx, read_stream(spark, spec.schema, Path(task.source), task.files_per_trigger))
        collected: list = []
        writer = out.writeStream.outputMode(contender.output_mode)
        if task.verify:
            writer = writer.foreachBatch(lambda batch, _id: collected.extend(tuple(r) for r in batch.collect()))
        else:
            writer = writer.format("noop")
        writer = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
        result["load_before"] = load_average()
        with TreeSampler() as sampler:
            t0 = time.perf_counter()
            query = writer.start()
            finished = query.awaitTermination(task.timeout_s)
            elapsed = time.perf_counter() - t0
        result["load_after"] = load_average()
        if not finished:
            result["error"] = f"timed out after {task.timeout_s:g} s"
            query.stop()
        # PySpark 4 gives StreamingQueryProgress objects, 3.5 dicts
        progress = [p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress]
        rows = sum(p.get("numInputRows", 0) for p in progress)
        result.update(events=rows, seconds=round(elapsed, 3),
                      events_per_s=round(rows / elapsed, 1) if elapsed > 0 and not result["error"] else None)
        result.update(summarize_batches(progress, warmup))
        if result["error"]:
            result["steady_events_per_s"] = None
        result.update(state_size(progress))
        result["memory"] = sampler.result()
        if task.verify and not result["error"]:
            result["output_digest"], result["output_rows"] = fingerprint(task.workload, collected)
    except Exception as exc:  # a failing contender is reported, the others still run
        result["error"] = _error_text(exc)
        result.setdefault("events_per_s", None)
        if query is not None and query.isActive:
            query.stop()
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
        shutil.rmtree(checkpoint, ignore_errors=True)
    return result


def main(argv: list[str]) -> int:
    """``python -m benchmarks.runner TASK.json RESULT.json``: one task in a fresh SparkSession."""
    task_path, result_path = argv
    task = Task(**json.loads(Path(task_path).read_text()))
    spark = start_session(task.jar, task.conf)
    try:
        result = execute(spark, task)
    finally:
        spark.stop()
    Path(result_path).write_text(json.dumps(result))
    return 0


def task_json(task: Task) -> str:
    return json.dumps(asdict(task))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
