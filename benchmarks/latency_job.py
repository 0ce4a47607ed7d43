"""One latency contender in a process (and a JVM) of its own: Kafka in -> the stateful query -> Kafka out.

``python -m benchmarks.latency_job TASK.json`` reads the input topic from its beginning, runs
the contender's query with the task's Spark settings (``conf``, over the benchmark's), Kafka
source options (``options``, over the consumer settings sparkstate's own Kafka source has:
:data:`sparkstate.io.sources.KAFKA_CONSUMER_DEFAULTS`) and trigger (``trigger``: a processing-time
interval; without it Spark's default, a micro-batch as soon as the previous one ends and data is
there) and writes each output row as JSON to the output topic, keyed by its first
column, through Spark's own Kafka sink. It runs until the file ``TASK.stop`` appears (the
driver of the benchmark, :mod:`benchmarks.latency`, creates it), then writes the query's
progress reports to ``TASK.progress.json``. ``sparkstate run``'s own job is not run here: the
benchmark starts it as the CLI command.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

#: What the producer writes: one JSON object carrying the fields of both workloads' inputs
#: (``word`` is the running-count pipeline's key, as ``sparkstate run running-count`` reads it).
COUNT_SCHEMA = "user string, seq long, activity string"
SESSIONS_SCHEMA = "user_id string, event_time timestamp, data string, is_last boolean"


#: The sessions workload's gap: longer than a contender's whole run, so that the warm-up's open
#: sessions (one per key) stay in state and none is closed by its gap while latency is measured. With
#: a gap of one minute, the warm-up's 42K-48K sessions were all closed in one batch, which fell in the
#: 1,000 events/s phase of every contender and set that phase's p99 (docs/bench/2026-12-07-session-wave.md).
SESSION_GAP_MS = 600_000
SESSION_WATERMARK_MS = 10_000


@dataclass(frozen=True)
class JobTask:
    contender: str
    workload: str  # count | sessions
    bootstrap: str
    topic_in: str
    topic_out: str
    checkpoint: str
    stop_file: str
    progress_file: str
    jar: str | None = None
    gap_ms: int = SESSION_GAP_MS
    watermark_ms: int = SESSION_WATERMARK_MS
    conf: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # the Kafka source's, over sparkstate's KAFKA_CONSUMER_DEFAULTS
    trigger: str | None = None  # processingTime, e.g. "100 milliseconds"; None: Spark's default


def _java(df: DataFrame) -> Any:
    return df.sparkSession._jvm.sparkstate.bench  # type: ignore[attr-defined,union-attr]


def _count_builders() -> dict[str, Callable[[DataFrame, JobTask], DataFrame]]:
    import sparkstate as ss

    from . import contenders as c
    from . import pyspark_raw as raw

    return {
        "java-mgws": lambda df, t: DataFrame(_java(df).RunningCount.apply(df._jdf, "user"), df.sparkSession),
        "pyspark-tws": lambda df, t: df.groupBy("user").transformWithState(
            raw.TwsCounter(), raw.COUNT_OUTPUT, "Update", "None"),
        # raw PySpark where transformWithState is missing (3.5, 4.0's Row API): applyInPandasWithState
        "pyspark-pandas": lambda df, t: df.groupBy("user").applyInPandasWithState(
            raw.pandas_count, raw.COUNT_OUTPUT, raw.COUNT_STATE, "update", "NoTimeout"),
        "sparkstate-batched": lambda df, t: ss.map_groups_with_state(
            df, key="user", func=c.count_per_key, state_type=int, output_type=raw.COUNT_OUTPUT, engine="batched"),
        # the batched engine without its packing step before the shuffle (a setting for latency)
        "sparkstate-nopack": lambda df, t: ss.map_groups_with_state(
            df, key="user", func=c.count_per_key, state_type=int, output_type=raw.COUNT_OUTPUT,
            engine=ss.BatchedEngine(pack=False)),
        # the engine on applyInPandasWithState (PySpark 3.5/4.0's default): no state server per task
        "sparkstate-inband": lambda df, t: ss.map_groups_with_state(
            df, key="user", func=c.count_per_key, state_type=int, output_type=raw.COUNT_OUTPUT, engine="inband"),
        "sparkstate-vectorized": lambda df, t: ss.map_batches_with_state(
            df, key="user", func=c.count_per_batch, state_type=int, output_type=raw.COUNT_OUTPUT),
    }


def _session_input(df: DataFrame, t: JobTask) -> DataFrame:
    return (df.withWatermark("event_time", f"{t.watermark_ms} milliseconds")
            .select("user_id", "event_time", "data", "is_last"))


def _session_builders() -> dict[str, Callable[[DataFrame, JobTask], DataFrame]]:
    from sparkstate.pipelines import sessionize

    from . import contenders as c
    from . import pyspark_raw as raw

    def sparkstate_sessions(df: DataFrame, t: JobTask) -> DataFrame:
        return sessionize(df, key="user_id", timestamp="event_time", gap=timedelta(milliseconds=t.gap_ms),
                          last_flag="is_last", time_mode="event", watermark=timedelta(milliseconds=t.watermark_ms),
                          data="data", emit_on_last=True)

    return {
        "java-fmgws": lambda df, t: DataFrame(
            _java(df).Sessionizer.apply(_session_input(df, t)._jdf, t.gap_ms, True), df.sparkSession),
        "pyspark-tws": lambda df, t: _session_input(df, t).groupBy("user_id").transformWithState(
            raw.TwsSessionizer(t.gap_ms, emit_on_last=True), c.SESSION_OUTPUT, "Append", "EventTime"),
        "pyspark-pandas": lambda df, t: _session_input(df, t).groupBy("user_id").applyInPandasWithState(
            raw.PandasSessionizer(t.gap_ms, emit_on_last=True), c.SESSION_OUTPUT, raw.PANDAS_SESSION_STATE, "append",
            "EventTimeTimeout"),
        "sparkstate-batched": sparkstate_sessions,
    }


def builders(workload: str) -> dict[str, Callable[[DataFrame, JobTask], DataFrame]]:
    """The library contenders of ``workload``, by name."""
    return _count_builders() if workload == "count" else _session_builders()


#: Output modes: the count is a key's latest total (update), a session is final (append).
OUTPUT_MODE = {"count": "update", "sessions": "append"}


def run(task: JobTask) -> None:
    from . import runner
    from sparkstate.io import connectors
    from sparkstate.io.sources import KAFKA_CONSUMER_DEFAULTS

    conf = {**connectors.spark_settings(kafka=True), **task.conf}
    if task.contender.startswith("java") or task.contender.startswith("pyspark-pandas"):
        conf["spark.sql.streaming.stateStore.encodingFormat"] = "unsaferow"
    spark = runner.start_session(task.jar, conf)
    schema = COUNT_SCHEMA if task.workload == "count" else SESSIONS_SCHEMA
    raw_in = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", task.bootstrap)
              .option("subscribe", task.topic_in).option("startingOffsets", "earliest")
              # every contender reads with the consumer settings `sparkstate run`'s source has
              .options(**{**KAFKA_CONSUMER_DEFAULTS, **task.options}).load())
    events = raw_in.select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*")
    out = builders(task.workload)[task.contender](events, task)
    record = out.select(F.col(out.columns[0]).cast("string").alias("key"),
                        F.to_json(F.struct(*[F.col(f"`{c}`") for c in out.columns])).alias("value"))
    writer = (record.writeStream.format("kafka").option("kafka.bootstrap.servers", task.bootstrap)
              .option("topic", task.topic_out).option("checkpointLocation", task.checkpoint)
              .outputMode(OUTPUT_MODE[task.workload]))
    if task.trigger:
        writer = writer.trigger(processingTime=task.trigger)
    query = writer.start()
    stop = Path(task.stop_file)
    try:
        while not stop.exists():
            if query.awaitTermination(0.2):  # type: ignore[arg-type]  # seconds, a float
                raise RuntimeError(f"{task.contender}: the query ended: {query.exception()}")
        # PySpark 3.5 gives the reports as plain dicts; 4.0 and later as StreamingQueryProgress, a dict
        # too, whose values (UUIDs) json cannot write: its own JSON is read back instead
        reports = [json.loads(p.json) if hasattr(p, "json") else p for p in query.recentProgress]
        Path(task.progress_file).write_text(json.dumps(reports))
    finally:
        if query.isActive:
            query.stop()
        spark.stop()


def main(argv: list[str]) -> int:
    run(JobTask(**json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
