"""``run_pipeline``: a source, a pipeline, a sink and a dead-letter sink, as one library call.

What ``sparkstate run`` does::

    source  = open_source(spark, config.source, schema=<the pipeline's>, fmt=config.format)
    output  = <pipeline>(source.events, ...)                          validated here, before anything starts
    query   = start_sink(output, config.sink, checkpoint=CHECKPOINT)
    dead    = start_sink(source.dead_letters, <dead-letter sink>, checkpoint=CHECKPOINT/_deadletter)
    MetricsListener: one JSON line per batch of either query -> config.metrics, on_batch -> display
    then: config.once -> wait until both are caught up; else run until Ctrl-C or a failure
    finally: each query stops after its running micro-batch has committed

Both queries read the source (the dead letters are a query of their own, with their own
checkpoint); an output row and a dead letter are counted through ``DataFrame.observe`` so the
counts are exact whatever the sink.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql import functions as F

from ..errors import ConfigError
from ..io.sinks import SinkSpec, parse_sink, start_sink
from ..io.sources import open_source, parse_source
from ..observe.listener import MetricsListener, OnBatch
from ..observe.metrics import DEAD_LETTER_OBSERVATION, OUTPUT_OBSERVATION, redact
from .config import JobConfig, with_absolute_paths
from .control import stop_after_current_batch, wait_until_caught_up, wait_until_stopped
from .pipelines import JOB_PIPELINES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

#: Sub-directory of the checkpoint that holds the dead-letter query's checkpoint.
DEADLETTER_CHECKPOINT = "_deadletter"

StoppedBy = Literal["caught_up", "interrupted", "stopped"]


@dataclass(frozen=True)
class JobResult:
    """What a run did. Counts cover this run (a restart on a checkpoint starts them at zero).

    ``stopped_by``: ``"caught_up"`` (``once``), ``"interrupted"`` (Ctrl-C) or ``"stopped"`` (the
    queries were stopped from elsewhere). ``output_rows`` is ``None`` when not counted;
    ``state_rows`` are the keys left in state after the last batch (open sessions).
    """

    pipeline: str
    stopped_by: StoppedBy
    batches: int
    input_rows: int
    output_rows: int | None
    timed_out: int | None
    dead_letters: int
    state_rows: int | None
    final_watermark: str | None
    sink: str
    deadletter: str | None
    checkpoint: str | None
    metrics: str | None
    query_id: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-ready values."""
        return asdict(self)


def _query_name(config: JobConfig, sink: SinkSpec) -> str | None:
    if sink.kind == "memory" and sink.name:
        return None  # the memory sink names the query after its table
    return config.query_name or f"sparkstate_{config.pipeline.replace('-', '_')}"


def _deadletter_sink(config: JobConfig, sink: SinkSpec) -> SinkSpec:
    if config.deadletter:
        return parse_sink(config.deadletter)
    if sink.deadletter_sink is not None:
        return sink.deadletter_sink
    if sink.kind == "console":
        return parse_sink("console")
    raise ConfigError(
        f"run: the sink {sink} has no default place for dead letters (malformed records are never dropped"
        " silently); pass --deadletter SPEC, e.g. --deadletter json:DIR"
    )


def run_pipeline(spark: "SparkSession", config: JobConfig, *, on_batch: OnBatch | None = None) -> JobResult:
    """Run ``config``'s pipeline from its source to its sink; return when it is done.

    With ``config.once`` it returns once the input available at the start (and the timers it
    makes due) is processed; otherwise it runs until Ctrl-C (``KeyboardInterrupt``, which it
    handles: the running micro-batch commits, then the queries stop) or until a query fails
    (:class:`~sparkstate.jobs.control.JobFailedError`). Bad settings raise
    :class:`~sparkstate.errors.ConfigError` before any query starts. ``on_batch(metrics,
    totals)`` is called on Spark's listener thread after every batch. Relative local paths are
    taken from this process's directory (:func:`~sparkstate.jobs.config.with_absolute_paths`).
    Nothing is printed.

    >>> import sparkstate as ss, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> os.mkdir(f"{d}/in"); _ = open(f"{d}/in/a.json", "w").write('{"word": "hi"}\\n{"word": "hi"}\\n')
    >>> result = run_pipeline(ss.spark_session(), JobConfig(
    ...     "running-count", source=f"files:{d}/in", sink="memory:doc_counts", checkpoint=f"{d}/ck",
    ...     deadletter=f"json:{d}/dead", once=True))
    >>> result.stopped_by, result.input_rows, result.output_rows
    ('caught_up', 2, 1)
    """
    started = time.monotonic()
    config = with_absolute_paths(config)
    pipeline = JOB_PIPELINES[config.pipeline]
    source = open_source(spark, parse_source(config.source), schema=pipeline.schema, fmt=config.format,
                         options=dict(config.options))
    output = pipeline.build(source.events, config, spark)
    sink = parse_sink(config.sink)
    counts = [F.count(F.lit(1)).alias("rows")] + (pipeline.observe() if pipeline.observe else [])
    output = output.observe(OUTPUT_OBSERVATION, *counts)
    dead_sink = None
    dead = None
    if source.dead_letters is not None:
        dead_sink = _deadletter_sink(config, sink)
        dead = source.dead_letters.observe(DEAD_LETTER_OBSERVATION, F.count(F.lit(1)).alias("rows"))

    listener = MetricsListener(config.metrics, on_batch)
    spark.streams.addListener(listener)
    queries: list[tuple[str, "StreamingQuery"]] = []
    stopped_by: StoppedBy = "stopped"
    try:
        name = _query_name(config, sink)
        query = start_sink(output, sink, checkpoint=config.checkpoint, trigger=config.trigger,
                           output_mode=pipeline.output_mode, query_name=name)  # type: ignore[arg-type]
        queries.append(("query", query))
        listener.watch(query, "output")
        if dead is not None and dead_sink is not None:
            dead_ck = None if config.checkpoint is None else f"{config.checkpoint.rstrip('/')}/{DEADLETTER_CHECKPOINT}"
            dead_name = None if (dead_sink.kind == "memory" and dead_sink.name) else f"{name or 'sparkstate'}_deadletters"
            dead_query = start_sink(dead, dead_sink, checkpoint=dead_ck, trigger=config.trigger,
                                    output_mode="append", query_name=dead_name)
            queries.append(("dead-letter query", dead_query))
            listener.watch(dead_query, "dead_letters")
        try:
            if config.once:
                wait_until_caught_up(queries)
                stopped_by = "caught_up"
            else:
                wait_until_stopped(queries)
        except KeyboardInterrupt:
            stopped_by = "interrupted"
    finally:
        try:
            for _, q in reversed(queries):
                stop_after_current_batch(q)
            for _, q in queries:  # let the listener record the last batches before reading totals
                last = q.lastProgress
                listener.wait_for(q, None if last is None else last.batchId, timeout_s=5.0)
        finally:
            spark.streams.removeListener(listener)
            listener.close()

    t = listener.totals
    return JobResult(
        pipeline=config.pipeline,
        stopped_by=stopped_by,
        batches=t.batches,
        input_rows=t.rows_in,
        output_rows=t.rows_out,
        timed_out=t.timed_out,
        dead_letters=t.dead_letters,
        state_rows=t.state_rows,
        final_watermark=t.watermark,
        sink=redact(str(sink)),
        deadletter=None if dead_sink is None else redact(str(dead_sink)),
        checkpoint=config.checkpoint,
        metrics=config.metrics,
        query_id=str(queries[0][1].id),
        seconds=round(time.monotonic() - started, 1),
    )


__all__ = ["DEADLETTER_CHECKPOINT", "JobResult", "run_pipeline"]
