"""The fixed cost of a small micro-batch, in counts a loaded machine does not change.

A warm job (a few thousand keys in state) is given one record at a time; for each such batch
this counts the Spark jobs and stages the query ran (``statusTracker``, the query's job group),
the py4j calls the driver's Python made (every ``GatewayClient.send_command``: the job's
``foreachBatch`` function, writers and listeners), the driver Python's CPU seconds
(``time.process_time``) and the CPU seconds of the JVM and of the Python workers it started
(``/proc``). Wall time is printed too, but on a shared machine only the counts compare.

    python -m benchmarks.fixed_cost --what run-count          # sparkstate run running-count: files in, parquet out
    python -m benchmarks.fixed_cost --what run-sessionize     # sparkstate run sessionize: files in, parquet out
    python -m benchmarks.fixed_cost --what operator           # ss.map_groups_with_state (batched), Spark's noop sink
    python -m benchmarks.fixed_cost --what run-count --sink kafka   # the same job, Kafka out (a local broker)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import traceback
from typing import Any

_calls = 0
_where: dict[str, int] | None = {} if os.environ.get("FIXED_COST_WHERE") else None


def _count_py4j_calls() -> None:
    from py4j.java_gateway import GatewayClient

    original = GatewayClient.send_command

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _calls
        stack = traceback.extract_stack(limit=60)[:-1]
        if not any(f.filename.endswith("fixed_cost.py") or f.name == "garbage_collect_object" for f in stack):
            # neither this script's own polling nor py4j's release of Python's dropped references
            _calls += 1
            if _where is not None:
                frames = [f for f in stack if "py4j" not in f.filename and "threading" not in f.filename]
                if not frames:
                    frames = stack
                key = " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in frames[-4:][::-1])
                _where[key] = _where.get(key, 0) + 1
        return original(self, *args, **kwargs)

    GatewayClient.send_command = counted  # type: ignore[method-assign]


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])  # utime stime cutime cstime


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            parents.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def _cpu_s(root: int) -> float:
    total = 0
    for pid in _descendants(root):
        try:
            total += _ticks(pid)
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


class Marks:
    def __init__(self, spark: Any, group: str) -> None:
        self.sc = spark.sparkContext
        self.group = group
        self.jvm = self.sc._gateway.proc.pid

    def take(self) -> dict[str, float]:
        global _calls
        calls = _calls
        tracker = self.sc.statusTracker()
        jobs = list(tracker.getJobIdsForGroup(self.group))
        stages = run_stages = 0
        for j in jobs:
            info = tracker.getJobInfo(j)
            if info is None:
                continue
            stages += len(info.stageIds)
            run_stages += sum(1 for s in info.stageIds if tracker.getStageInfo(s) is not None
                              and tracker.getStageInfo(s).numTasks > 0)
        mark = {"jobs": len(jobs), "stages": stages, "stages_run": run_stages, "py4j": calls,
                "driver_py_cpu_s": time.process_time(), "jvm_and_workers_cpu_s": _cpu_s(self.jvm),
                "wall_s": time.monotonic()}
        _calls = calls  # the marks' own calls are not the batch's
        return mark


def _diff(a: dict, b: dict) -> dict:
    return {k: round(b[k] - a[k], 3) for k in a}


def _wait_batches(query: Any, n: int, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        p = query.lastProgress
        if p is not None and p["batchId"] >= n and not query.status["isTriggerActive"]:
            return
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        time.sleep(0.05)
    raise TimeoutError(f"batch {n} did not come")


def _write(dir_: str, name: str, lines: list[str]) -> None:
    tmp = os.path.join(dir_, f".{name}")
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(tmp, os.path.join(dir_, name))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", choices=["run-count", "run-sessionize", "operator"], default="run-count")
    ap.add_argument("--keys", type=int, default=3000)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--trigger", default="100 milliseconds")
    ap.add_argument("--out", default=None, help="write the per-batch counts here (JSON)")
    ap.add_argument("--sink", choices=["parquet", "kafka"], default="parquet",
                    help="the job's output (run-*): Parquet files, or a topic of a local Kafka broker")
    args = ap.parse_args()
    if args.sink == "kafka" and args.what != "operator":
        from sparkstate.io import kafka_broker

        with kafka_broker.start() as broker:
            broker.create_topic("out", partitions=2)
            measure(args, f"kafka:{broker.bootstrap}/out")
    else:
        measure(args, None)


def measure(args: argparse.Namespace, sink: str | None) -> None:
    _count_py4j_calls()
    import sparkstate as ss

    from sparkstate.io import connectors

    spark = ss.spark_session(config=connectors.spark_settings(kafka=True) if sink else None)
    work = tempfile.mkdtemp(prefix="fixedcost-")
    inp = os.path.join(work, "in")
    os.mkdir(inp)
    t0 = 1_700_000_000
    if args.what in ("run-count", "operator"):
        warm = [json.dumps({"word": f"k{i}"}) for i in range(args.keys)]
        one = lambda i: [json.dumps({"word": f"k{i % args.keys}"})]
    else:
        warm = [json.dumps({"user_id": f"u{i}", "ts": t0 + i % 60, "page": "/a"}) for i in range(args.keys)]
        one = lambda i: [json.dumps({"user_id": f"u{i % args.keys}", "ts": t0 + 61 + i, "page": "/b"})]
    _write(inp, "000-warm.json", warm)
    holder: dict[str, Any] = {}

    if args.what == "operator":
        def count(key, rows, state):
            n = (state.get if state.exists else 0) + sum(1 for _ in rows)
            state.update(n)
            return (key, n)

        events = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1).json(inp)
        out = ss.map_groups_with_state(events, key="word", func=count, state_type=int,
                                       output_type="word string, n long", engine="batched")
        query = (out.writeStream.format("noop").outputMode("update").trigger(processingTime=args.trigger)
                 .option("checkpointLocation", os.path.join(work, "ck")).start())
        holder["query"] = query
    else:
        from sparkstate.jobs.config import JobConfig
        from sparkstate.jobs.run import run_pipeline

        pipeline = "running-count" if args.what == "run-count" else "sessionize"
        config = JobConfig(pipeline, source=f"files:{inp}", sink=sink or f"parquet:{work}/out", checkpoint=f"{work}/ck",
                           deadletter=f"json:{work}/dead", trigger=args.trigger)

        def run() -> None:
            try:
                holder["result"] = run_pipeline(spark, config)
            except BaseException as exc:  # reported below
                holder["error"] = exc

        threading.Thread(target=run, daemon=True).start()
        end = time.monotonic() + 300
        while not spark.streams.active and time.monotonic() < end:
            if "error" in holder:
                raise holder["error"]
            time.sleep(0.05)
        query = spark.streams.active[0]
    _wait_batches(query, 0)
    marks = Marks(spark, str(query.runId))
    rows = []
    for i in range(1, args.batches + 1):
        before = marks.take()
        _write(inp, f"{i:03d}.json", one(i))
        _wait_batches(query, query.lastProgress["batchId"] + 1)
        time.sleep(0.3)  # let the listener's report and the job's last calls land
        rows.append(_diff(before, marks.take()))
        rows[-1]["duration_ms"] = query.lastProgress["durationMs"]
    query.stop()
    if _where is not None:
        for k, v in sorted(_where.items(), key=lambda kv: -kv[1])[:25]:
            print(v, k)
    skip = 2  # the first small batches compile what the warm-up's plan did not
    med = {k: statistics.median(r[k] for r in rows[skip:]) for k in rows[0] if k != "duration_ms"}
    med["triggerExecution_ms"] = statistics.median(r["duration_ms"]["triggerExecution"] for r in rows[skip:])
    print(json.dumps({"what": args.what, "sink": args.sink, "keys": args.keys, "median_per_batch": med}, indent=1))
    for r in rows:
        print({k: v for k, v in r.items() if k != "duration_ms"}, r["duration_ms"].get("triggerExecution"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"what": args.what, "sink": args.sink, "keys": args.keys, "median_per_batch": med,
                       "batches": rows}, f, indent=1)


if __name__ == "__main__":
    main()
