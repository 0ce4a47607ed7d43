"""Scale-out of the batched engine's stateful work on a Spark standalone cluster (``make bench-scaleout``).

For 1, 2 and 3 workers (one core each, all on this machine): ``sparkstate run running-count``
on files of words, one file per micro-batch, ``--partitions`` state partitions (default 6, so
a new checkpoint gets the batched engine's bucket count for 6). From Spark's event log: per
micro-batch, the stateful stage's tasks that updated state, the executors they ran on, and
their run time; from the job's metrics: events per second over the batches after the first.

From the per-task cost it works out a 100-node cluster (``--nodes``, ``--cores-per-node``): the
stateful cost per event divided over the cores, plus the per-batch overhead measured here (the
part of a batch no task accounts for: planning, offsets, commits). Workers that share a small
machine cannot show real scale-out; the per-task cost is what carries over.

    python -m benchmarks.scaleout [--workers 1,2,3] [--keys 5000] [--files 3] [--rows 10000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

#: The SQL metric a stateful operator's task reports when it wrote state (Spark's name).
UPDATED = "number of updated state rows"


def stateful_tasks(event_dir: Path) -> list[dict[str, Any]]:
    """The stateful stages of the applications logged in ``event_dir``: per stage, the tasks that
    updated state (partition, executor, run time in ms)."""
    stages: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for log in sorted(p for p in event_dir.rglob("*") if p.is_file()):  # one plain file per application
        for line in log.read_text(errors="replace").splitlines():
            if '"SparkListenerTaskEnd"' not in line:
                continue
            ev = json.loads(line)
            info = ev.get("Task Info") or {}
            updated = [a for a in info.get("Accumulables") or [] if a.get("Name") == UPDATED]
            if not updated:
                continue
            if int(updated[0].get("Update") or 0) <= 0 or info.get("Failed") or info.get("Killed"):
                continue
            stages[(log.name, ev["Stage ID"])].append({
                "partition": info.get("Partition ID", info.get("Index")),
                "executor": info.get("Executor ID"),
                "run_ms": int((ev.get("Task Metrics") or {}).get("Executor Run Time") or 0),
            })
    return [{"stage": k[1], "tasks": v} for k, v in sorted(stages.items())]


def write_words(directory: Path, files: int, rows: int, keys: int) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lines = "".join(f'{{"word": "k{(f * 7919 + i * 104729) % keys}"}}\n' for i in range(rows))
        tmp = directory / f".part-{f:04d}.tmp"
        tmp.write_text(lines)
        os.utime(tmp, ns=((1_700_000_000 + f) * 10**9, (1_700_000_000 + f) * 10**9))
        tmp.rename(directory / f"part-{f:04d}.json")
    return files * rows


def run_one(workers: int, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests.reliability.standalone import SCRIPT, running_cluster, spawn, stop_tree, tail

    root.mkdir(parents=True)
    events = write_words(root / "in", args.files, args.rows, args.keys)
    conf, logs = root / "driver-conf", root / "events"
    for d in (conf, logs, root / "cluster"):
        d.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.sql.shuffle.partitions {args.partitions}\nspark.eventLog.enabled true\n"
        f"spark.eventLog.dir file://{logs}\nspark.eventLog.rolling.enabled false\nspark.eventLog.compress false\n"
        "spark.executor.memory 768m\n"
        # every worker's executor registered before the first job (else a slow start runs it on fewer)
        "spark.scheduler.minRegisteredResourcesRatio 1.0\nspark.scheduler.maxRegisteredResourcesWaitingTime 120s\n")
    with running_cluster(root / "cluster", workers) as cluster:
        metrics, log = root / "metrics.jsonl", root / "driver.log"
        started = time.monotonic()
        driver = spawn([SCRIPT, "run", "running-count", "--master", cluster.url, "--source", f"files:{root / 'in'}",
                         "--format", "json", "--max-batch-files", "1", "--sink", f"json:{root / 'out'}",
                         "--checkpoint", root / "ck", "--once", "--metrics", metrics, "--no-progress"],
                        log, {**cluster.env, "SPARK_CONF_DIR": str(conf)}, root)
        try:
            code = driver.wait(timeout=args.timeout)
        finally:
            if driver.poll() is None:  # interrupted or timed out: the driver goes with the cluster
                stop_tree([driver.pid])
                driver.wait(timeout=30)
        wall = time.monotonic() - started
        if code != 0:
            raise SystemExit(f"{workers} worker(s): the job failed ({code}):\n{tail(log, 40)}")
    batches = [m for m in map(json.loads, metrics.read_text().splitlines())
               if m.get("query") == "output" and m["rows_in"] > 0]
    steady = batches[1:] or batches
    rows, ms = sum(b["rows_in"] for b in steady), sum(b["batch_duration_ms"] for b in steady)
    stages = stateful_tasks(logs)
    data_stages = [s for s in stages if len(s["tasks"]) > 1]
    per_stage = [len(s["tasks"]) for s in data_stages]
    executors = sorted({t["executor"] for s in data_stages for t in s["tasks"]})
    steady_stages = data_stages[1:] or data_stages
    task_ms = [t["run_ms"] for s in steady_stages for t in s["tasks"]]
    events_per_task = args.rows / args.partitions
    stage_task_ms = [sum(t["run_ms"] for t in s["tasks"]) for s in steady_stages]
    return {
        "workers": workers, "events": events, "wall_s": round(wall, 1),
        "batches": len(batches), "events_per_s": round(rows / (ms / 1000), 1) if ms else None,
        "batch_ms_median": statistics.median(b["batch_duration_ms"] for b in steady),
        "stateful_tasks_per_stage": per_stage, "executors_with_stateful_tasks": len(executors),
        "stateful_task_ms_median": statistics.median(task_ms) if task_ms else None,
        "stateful_us_per_event": round(statistics.median(task_ms) * 1000 / events_per_task, 2) if task_ms else None,
        "stateful_stage_task_ms_median": statistics.median(stage_task_ms) if stage_task_ms else None,
    }


def project(result: dict[str, Any], batch_events: int, nodes: int, cores: int, partitions: int) -> dict[str, Any]:
    """A ``nodes`` x ``cores`` cluster from one measured configuration: the stateful cost per event
    spread over min(partitions, cores) tasks at once, plus the per-batch overhead measured here
    (batch time that the stateful tasks of a one-core worker do not account for)."""
    per_event_us = result["stateful_us_per_event"]
    overhead_ms = max(0.0, result["batch_ms_median"] - result["stateful_stage_task_ms_median"])
    slots = min(nodes * cores, partitions)
    stateful_ms = batch_events * per_event_us / 1000 / slots
    batch_ms = overhead_ms + stateful_ms
    return {"nodes": nodes, "cores_per_node": cores, "partitions": partitions, "batch_events": batch_events,
            "overhead_ms": round(overhead_ms), "stateful_ms": round(stateful_ms, 1), "batch_ms": round(batch_ms),
            "events_per_s": round(batch_events / (batch_ms / 1000))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--keys", type=int, default=5000)
    ap.add_argument("--files", type=int, default=3, help="micro-batches")
    ap.add_argument("--rows", type=int, default=10000, help="events per micro-batch")
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--cores-per-node", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="sparkstate-scaleout-") as tmp:
        for w in (int(x) for x in args.workers.split(",")):
            r = run_one(w, Path(tmp) / f"w{w}", args)
            results.append(r)
            print(json.dumps(r), flush=True)
    base = results[0]
    projections = [project(base, n * c * 100_000, n, c, n * c * 2)
                   for n, c in ((args.nodes, args.cores_per_node),)]
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
           "load_average_at_start": [round(x, 1) for x in load],
           "load_average_at_end": [round(x, 1) for x in os.getloadavg()],
           "settings": {k: getattr(args, k) for k in ("partitions", "keys", "files", "rows")},
           "results": results, "projection": projections}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
