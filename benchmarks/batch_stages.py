"""A streaming query's small micro-batches, stage by stage, from Spark's event log.

Turn the event log on for the queries to look at, for instance with a ``spark-defaults.conf`` in
``SPARK_CONF_DIR`` (every contender of ``benchmarks.latency`` reads it)::

    spark.eventLog.enabled  true
    spark.eventLog.dir      file:///tmp/eventlog
    spark.eventLog.compress false

(uncompressed: a compressed log of a process that is stopped can end mid-frame), then::

    python -m benchmarks.batch_stages /tmp/eventlog/*

For each log (one application; an ``eventlog_v2_*`` directory or a single file), each streaming
query in it, and its micro-batches that read the fewest records (by default; ``--rows N``
chooses), it prints the median of: the batch and its phases (the progress's ``durationMs``), the
time from the SQL execution's start to its Spark job's (the physical plan), the job, each stage
of it with its tasks, and the offset and commit logs. This is how the latency records in
docs/bench/ break a one-record batch down (``2026-11-28-count-stages.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

#: The job properties Spark's micro-batch execution sets on every job of a batch.
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"


@dataclass
class Job:
    start: int
    end: int | None = None
    sql: int | None = None
    stages: list[int] = field(default_factory=list)


@dataclass
class Log:
    """What one application's event log says about its streaming queries' batches."""

    name: str = "?"
    progress: dict[tuple[str, int], dict] = field(default_factory=dict)  # (query id, batch) -> progress
    jobs: dict[tuple[str, int], list[Job]] = field(default_factory=lambda: defaultdict(list))
    sql: dict[int, list[int]] = field(default_factory=dict)  # execution id -> [start, end]
    stages: dict[int, tuple[str, int]] = field(default_factory=dict)  # stage id -> (name, duration ms)
    tasks: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # stage id -> task ms


def _files(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.name.startswith("events_")) if path.is_dir() else [path]
    if not files:
        raise SystemExit(f"batch_stages: {path} holds no event log (events_* files)")
    for f in files:
        if f.suffix in (".zstd", ".lz4", ".snappy", ".lzf"):
            raise SystemExit(f"batch_stages: {f} is compressed; run the query with spark.eventLog.compress false")
    return files


def read_log(path: Path) -> Log:
    """Parse the event log at ``path``; a last line cut short (a process stopped) is left out."""
    log = Log()
    open_jobs: dict[int, Job] = {}
    for f in _files(path):
        for line in f.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            kind = e.get("Event", "")
            if kind == "SparkListenerApplicationStart":
                log.name = e.get("App Name", "?")
            elif kind.endswith("QueryProgressEvent"):
                p = e["progress"]
                log.progress[(p["id"], p["batchId"])] = p
            elif kind == "SparkListenerJobStart":
                props = e.get("Properties") or {}
                job = Job(e["Submission Time"], sql=int(props["spark.sql.execution.id"])
                          if "spark.sql.execution.id" in props else None, stages=list(e.get("Stage IDs", [])))
                open_jobs[e["Job ID"]] = job
                if QUERY_ID in props and BATCH_ID in props:
                    log.jobs[(props[QUERY_ID], int(props[BATCH_ID]))].append(job)
            elif kind == "SparkListenerJobEnd" and e["Job ID"] in open_jobs:
                open_jobs[e["Job ID"]].end = e["Completion Time"]
            elif kind.endswith("SQLExecutionStart"):
                log.sql[e["executionId"]] = [e["time"], e["time"]]
            elif kind.endswith("SQLExecutionEnd") and e["executionId"] in log.sql:
                log.sql[e["executionId"]][1] = e["time"]
            elif kind == "SparkListenerStageCompleted":
                info = e["Stage Info"]
                if "Submission Time" in info and "Completion Time" in info:
                    log.stages[info["Stage ID"]] = (info["Stage Name"], info["Completion Time"] - info["Submission Time"])
            elif kind == "SparkListenerTaskEnd":
                info = e["Task Info"]
                log.tasks[e["Stage ID"]].append(info["Finish Time"] - info["Launch Time"])
    return log


def input_rows(progress: dict) -> int:
    """The records a batch read, over its sources (a source scanned twice counts twice)."""
    return sum(int(s.get("numInputRows") or 0) for s in progress.get("sources", []))


def breakdown(log: Log, rows: int | None = None) -> dict[str, tuple[int, dict[str, float]]]:
    """Per query (its name, else its id): how many batches were taken and the median of each
    figure over them. The batches taken read ``rows`` records, by default the fewest any batch
    with input read."""
    by_query: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for qid, batch in log.progress:
        by_query[qid].append((qid, batch))
    out: dict[str, tuple[int, dict[str, float]]] = {}
    for qid, keys in by_query.items():
        sizes = [input_rows(log.progress[k]) for k in keys]
        want = rows if rows is not None else min((n for n in sizes if n > 0), default=0)
        taken = [k for k, n in zip(keys, sizes) if n == want and want > 0]
        figures: dict[str, list[float]] = defaultdict(list)
        for k in taken:
            for phase, ms in log.progress[k].get("durationMs", {}).items():
                figures[f"progress {phase}"].append(ms)
            jobs = sorted(log.jobs.get(k, []), key=lambda j: j.start)
            figures["Spark jobs"].append(len(jobs))
            for i, job in enumerate(jobs):
                if job.end is None:
                    continue
                if i == 0 and job.sql in log.sql:
                    figures["physical plan (SQL start to job start)"].append(job.start - log.sql[job.sql][0])
                figures[f"job {i}"].append(job.end - job.start)
                for n, stage in enumerate(s for s in sorted(job.stages) if s in log.stages):
                    figures[f"job {i} stage {n}"].append(log.stages[stage][1])
                    figures[f"job {i} stage {n}: tasks"].append(len(log.tasks.get(stage, [])))
                    if log.tasks.get(stage):
                        figures[f"job {i} stage {n}: task (median)"].append(statistics.median(log.tasks[stage]))
                        figures[f"job {i} stage {n}: task (longest)"].append(max(log.tasks[stage]))
        name = next((log.progress[k].get("name") for k in keys if log.progress[k].get("name")), None) or qid
        out[name] = (len(taken), {f: statistics.median(v) for f, v in figures.items() if len(v) * 2 >= len(taken)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batch_stages", description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+", type=Path, help="event logs: eventlog_v2_* directories or files")
    p.add_argument("--rows", type=int, default=None, help="take the batches that read this many records"
                   " (default: the fewest any batch read)")
    args = p.parse_args(argv)
    for path in args.logs:
        log = read_log(path)
        for query, (n, figures) in breakdown(log, args.rows).items():
            print(f"== {log.name} / {query}: {n} batches ({path})")
            for name, ms in figures.items():
                print(f"  {name:48s} {ms:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
