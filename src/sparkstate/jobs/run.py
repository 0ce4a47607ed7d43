"""``run_pipeline``: a source, a pipeline, a sink and a dead-letter sink, as one library call.

What ``sparkstate run`` does::

    check   the checkpoint: made by this pipeline (its marker file), state that fits   nothing written yet
    pipeline = JOB_PIPELINES[config.pipeline]   its declaration: schema, output mode, refusals, marker
    source  = open_source(spark, config.source, schema=<the pipeline's>, fmt=config.format)
    given, dead = pipeline_input(source, ...)   the pipeline's records; the source's dead letters, or
              none when the pipeline refuses malformed records itself (one read: every pipeline but
              processing-time sessionize, on a checkpoint that does not read twice)
    output  = <pipeline>(given, ...)        validated here; rows it refuses carry a reason
    query   = ONE streaming query on  output ∪ dead,  checkpoint CHECKPOINT
              both sinks Kafka on one broker: Spark's Kafka write, each row to its topic (_kafka_records)
              else foreachBatch: output rows -> the sink, dead letters (malformed + refused) -> the dead-letter sink
    MetricsListener: one JSON line per batch -> config.metrics, on_batch -> display
    before: a restarted job plans the no-data batch its last run left owed (owed_batch.py), so the
            timeouts due by the restored watermark (or the clock) fire without waiting for new data
    then: config.once -> wait until caught up; else run until Ctrl-C or a failure
    finally: the query stops after its running micro-batch, and the no-data batch that one made owed,
             have committed

One query, because only the stateful operator knows the watermark of a micro-batch, so only
it can tell a late event, and a query has one sink: :class:`~sparkstate.jobs.tee.JobTee`
writes each batch's two parts, each sink exactly once per batch id (see
:mod:`sparkstate.jobs.tee`); when both parts go to Kafka, Spark's own Kafka write sends each row
to its topic (at-least-once, as the Kafka sink always is). Every record read is then in exactly
one place: an output row's input, or a dead letter with its reason. Counts come from ``DataFrame.observe`` (records in,
rows out, dead letters, late events), so they are exact whatever the sink.

This module is the query's life: defining the job, starting the query (again, on its
checkpoint, when Spark's Python process for it did not connect back), waiting, stopping, the
result. The checkpoint's marker is :mod:`sparkstate.jobs.marker`; the DataFrame that merges
output rows and dead letters is :mod:`sparkstate.jobs.combined`.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from .. import fs
from ..durations import to_ms
from ..engines import runtime
from ..errors import JobFailedError, SparkStateError, explain, from_spark
from ..io.connectors import require_kafka_connector
from ..io.kafka import stream_records
from ..io.parse import DEAD_LETTER_SCHEMA, to_struct
from ..io.query_id import own_query_id
from ..io.sinks import SinkSpec, check_sink_paths, parse_sink
from ..io.sources import open_source
from ..io.writers import batch_writer, describe, file_layout
from ..observe.listener import MetricsListener, OnBatch, add_listener, remove_listener
from ..observe.metrics import INPUT_OBSERVATION, RunTotals, redact
from ..owed_batch import owed_batch, queue_owed_batch
from ..spark import START_ATTEMPTS, WORKER_NOT_BACK, is_connect, pause_before_attempt, start_query
from . import connect_runs
from .combined import combined_stream, pipeline_input
from .config import JobConfig, deadletters_needed, source_options
from .control import stop_after_current_batch, wait_until_caught_up, wait_until_stopped
from .marker import check_checkpoint, reads_once, write_marker
from .pipelines import JOB_PIPELINES, JobPipeline
from .tee import DEAD, OUT, JobTee

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("sparkstate.jobs")

StoppedBy = Literal["caught_up", "interrupted", "stopped"]

#: Seconds a stop waits for the running micro-batch, and the no-data batch it made owed, to commit
#: (plus one trigger interval, after which Spark starts that batch); a restart runs what it cut.
STOP_WAIT_S = 60.0


@dataclass(frozen=True)
class JobResult:
    """What a run did. Counts cover this run (a restart on a checkpoint starts them at zero).

    ``stopped_by``: ``"caught_up"`` (``once``), ``"interrupted"`` (Ctrl-C) or ``"stopped"`` (the
    query was stopped from elsewhere). ``input_rows`` are the records read; ``output_rows`` is
    ``None`` when not counted; ``dead_letters`` are the records written to the dead-letter sink
    (malformed, and refused by the pipeline), ``late_events`` those of them refused as older than
    the watermark (``None``: the pipeline refuses nothing); ``keys_in_state`` are the keys left
    in state after the last batch (open sessions), read from the checkpoint (``None`` when it
    could not be read); ``state_rows`` are the state store's rows then (Spark's
    ``numRowsTotal``: one per key for the ``tws`` engine, buckets and leaves of many keys for
    ``batched``).
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
    late_events: int | None = None
    keys_in_state: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-ready values."""
        return asdict(self)


def _deadletter_sink(config: JobConfig, sink: SinkSpec) -> SinkSpec:
    if config.deadletter_spec is not None:
        return config.deadletter_spec
    if sink.deadletter_sink is not None:
        return sink.deadletter_sink
    if sink.kind == "console":
        return parse_sink("console")
    raise deadletters_needed(sink)


# --- the one query -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Job:
    """A job defined and checked, before anything is written."""

    pipeline: JobPipeline
    combined: "DataFrame"
    out_schema: StructType
    refuses: bool
    sink: SinkSpec
    dead_sink: SinkSpec | None
    name: str
    checkpoint: str
    own_checkpoint: bool
    trigger_ms: int


def _define(spark: "SparkSession", config: JobConfig) -> _Job:
    """Open the source, define the pipeline and check everything; nothing is written yet."""
    pipeline = JOB_PIPELINES[config.pipeline]
    sink = config.sink_spec
    check_checkpoint(config, spark)
    source = open_source(spark, config.source_spec, schema=pipeline.schema, fmt=config.format,
                         options=source_options(config))
    # A checkpoint's query keeps the number of source scans it started with (Spark refuses another).
    given, dead_letters = pipeline_input(source, pipeline, config, one_read=reads_once(config, spark))
    events = given.observe(INPUT_OBSERVATION, F.count(F.lit(1)).alias("rows"))
    output = pipeline.build(events, config, spark)  # checks the state in the checkpoint (checkpoint=)
    combined, out_schema, refuses = combined_stream(output, dead_letters, pipeline, str(source.spec),
                                                    source.max_record_bytes)
    dead_sink = _deadletter_sink(config, sink) if (source.dead_letters is not None or refuses) else None
    checkpoint = config.checkpoint  # a sink that needs one has one: JobConfig
    connect = is_connect(spark)
    check_sink_paths(sink, checkpoint, pipeline.output_mode, file_layout(pipeline.output_mode, connect), spark)
    if dead_sink is not None:
        check_sink_paths(dead_sink, checkpoint, "append", file_layout("append", connect), spark)
    trigger_ms = to_ms(config.trigger)  # checked by JobConfig
    ck = checkpoint or tempfile.mkdtemp(prefix="sparkstate-checkpoint-")  # console and memory sinks only
    name = config.query_name or f"sparkstate_{config.pipeline.replace('-', '_')}"
    return _Job(pipeline, combined, out_schema, refuses, sink, dead_sink, name, ck, checkpoint is None, trigger_ms)


def _tee(spark: "SparkSession", job: _Job) -> JobTee:
    """The writers of the job's output and dead letters (creating what their sinks need)."""
    ck = None if job.own_checkpoint else job.checkpoint
    writer = batch_writer(spark, job.sink, job.pipeline.output_mode, job.out_schema, job.name, checkpoint=ck)
    dead_writer = None
    if job.dead_sink is not None:
        dead_writer = batch_writer(spark, job.dead_sink, "append", to_struct(DEAD_LETTER_SCHEMA),
                                   f"{job.name}_deadletters", title="Dead letters, batch", checkpoint=ck)
    connect = is_connect(spark)
    log.info("run %s: output to %s, dead letters to %s", job.pipeline.name,
             describe(job.sink, job.pipeline.output_mode, connect),
             job.dead_sink and describe(job.dead_sink, "append", connect))
    # Spark 3.5 reports no observed counts for a batch without input (the one that fires timeouts):
    # the job takes the output's counts itself, in the job that runs the batch.
    counts = None if runtime.has(runtime.OBSERVED_WITHOUT_INPUT) else (job.pipeline.observe or list)
    return JobTee(writer, dead_writer, counts)


def _kafka_records(spark: "SparkSession", job: _Job) -> "DataFrame | None":
    """The job's stream as Kafka records, when the query writes it straight to Kafka; else ``None``
    (the query writes through :class:`~sparkstate.jobs.tee.JobTee`).

    Straight to Kafka when the output goes to Kafka and the dead letters (if any) to the same
    brokers, on a classic session of a Spark that reports a batch's observations without input
    (4.0 and later): one streaming write sends each row to its topic as the batch runs, with no
    ``foreachBatch``, no persisted batch and no second write
    (:func:`~sparkstate.io.kafka.stream_records`; the messages name their batch by its time).
    The query id the messages carry is written into the checkpoint first (:func:`own_query_id`).
    """
    dead = job.dead_sink
    if job.sink.kind != "kafka" or (dead is not None and (dead.kind != "kafka" or dead.url != job.sink.url)):
        return None
    if is_connect(spark) or not runtime.has(runtime.OBSERVED_WITHOUT_INPUT):
        return None
    require_kafka_connector(spark, str(job.sink))
    try:
        query_id = own_query_id(spark, job.checkpoint)
    except fs.FsUnavailable as exc:
        log.info("run %s: writing through foreachBatch: %s", job.pipeline.name, exc)
        return None
    log.info("run %s: output to %s and dead letters to %s, in one streaming write", job.pipeline.name, job.sink,
             dead)
    return stream_records(job.combined, OUT, DEAD, (str(job.sink.table), None if dead is None else dead.table),
                          query_id)


def run_pipeline(spark: "SparkSession", config: JobConfig, *, on_batch: OnBatch | None = None) -> JobResult:
    """Run ``config``'s pipeline from its source to its sink; return when it is done.

    With ``config.once`` it returns once the input available at the start (and the timers it
    makes due) is processed; otherwise it runs until Ctrl-C (``KeyboardInterrupt``, which it
    handles: the running micro-batch commits, then the no-data batch firing the timeouts its
    watermark made due, then the query stops; Ctrl-C again stops it at once) or until the query fails
    (:class:`~sparkstate.jobs.control.JobFailedError`, whose message is one line: for a state
    function that raised, its exception and the key). Bad settings, and a checkpoint made by
    another pipeline or holding state that does not fit, raise a
    :class:`~sparkstate.errors.SparkStateError` before anything is written. ``on_batch(metrics,
    totals)`` is called on Spark's listener thread after every batch. Relative local paths were
    made absolute from this process's directory when ``config`` was made (:class:`JobConfig`).
    On a checkpoint whose last run stopped before the no-data batch Spark owed it (Ctrl-C, a
    crash, an earlier ``once`` run), that batch runs first
    (:func:`~sparkstate.owed_batch.queue_owed_batch`): the timeouts due by the restored watermark,
    or by the clock, fire without new input. Nothing is printed.

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
    job = _define(spark, config)
    what = f"run {job.pipeline.name}"
    # Over Connect: a run of this job left on the server by a client that is gone is stopped first.
    run = connect_runs.claim(spark, job.checkpoint, job.name, what) if is_connect(spark) and not job.own_checkpoint else None
    try:
        return _run(spark, config, job, what, on_batch, started)
    finally:
        connect_runs.release(run)


def _run(spark: "SparkSession", config: JobConfig, job: _Job, what: str, on_batch: OnBatch | None,
         started: float) -> JobResult:
    # Every check passed: from here on things are written.
    records = _kafka_records(spark, job)
    tee = _tee(spark, job) if records is None else None
    write_marker(config, spark)
    owed = None if job.own_checkpoint else _queue_owed_batch(spark, job.checkpoint, what)
    listener = MetricsListener(config.metrics, on_batch,
                               tee.counted_of if tee is not None and tee.counts is not None else None)
    add_listener(spark, listener)
    query: Any = None  # a StreamingQuery (start_query returns it as an object)
    try:
        if tee is not None:
            writer = job.combined.writeStream.foreachBatch(tee)
        else:
            assert records is not None
            writer = records.writeStream.format("kafka").option("kafka.bootstrap.servers", job.sink.url)
        writer = (writer.outputMode(job.pipeline.output_mode).option("checkpointLocation", job.checkpoint).trigger(processingTime=f"{job.trigger_ms} milliseconds")
                  .queryName(job.name))
        for attempt in range(1, START_ATTEMPTS + 1):
            query = start_query(writer, what)
            listener.watch(query, "output")
            try:
                stopped_by = _wait(query, config.once, owed)
                break
            except JobFailedError:
                if attempt == START_ATTEMPTS or not _worker_not_back(query):
                    raise
                # Committed batches stay committed: the query goes on from its checkpoint, exactly.
                log.warning("%s: the query stopped because Spark's Python process for it did not connect back within"
                            " Spark's fixed 10 s (a busy machine); starting it again on its checkpoint (attempt %d of"
                            " %d)", what, attempt + 1, START_ATTEMPTS)
                pause_before_attempt(attempt)
    finally:
        failing = sys.exc_info()[1]
        try:
            if query is not None:
                try:
                    _stop(spark, query, listener, None if job.own_checkpoint else job.checkpoint, job.trigger_ms)
                except Exception as exc:
                    if failing is not None:  # the run's own error is the one to report
                        log.warning("%s: stopping the failed query also failed: %s", what, explain(exc))
                    elif from_spark(exc):
                        raise JobFailedError(f"stopping the query failed: {explain(exc)}") from exc
                    else:
                        raise
            if tee is not None:
                tee.flush()
        finally:
            remove_listener(spark, listener)
            listener.close()
            # (not while an error propagates: the run failed, nothing will be reported)
            keys_left = _keys_in_state(spark, job.checkpoint) if failing is None else None
            if job.own_checkpoint:
                shutil.rmtree(job.checkpoint, ignore_errors=True)
    return _result(config, job, listener.totals, str(query.id), stopped_by, keys_left, time.monotonic() - started)


def _wait(query: Any, once: bool, owed: int | None) -> StoppedBy:
    """Wait until the query is caught up (``once``; not by the owed batch ``owed`` it runs first),
    stopped, failed (raises) or interrupted (Ctrl-C)."""
    try:
        if once:
            wait_until_caught_up([("query", query)], after_batch=owed)
            return "caught_up"
        wait_until_stopped([("query", query)])
        return "stopped"
    except KeyboardInterrupt:
        return "interrupted"


def _worker_not_back(query: Any) -> bool:
    """Whether ``query`` failed because a Python process Spark started did not connect back in time."""
    exc = query.exception()
    return exc is not None and WORKER_NOT_BACK in str(exc)


def _queue_owed_batch(spark: "SparkSession", checkpoint: str, what: str) -> int | None:
    """Plan the no-data batch a stop left owed, so that the timeouts it fires do not wait for new input;
    its batch id, or ``None``."""
    owed = queue_owed_batch(spark, checkpoint)
    if owed is None:
        return None
    log.info("%s: batch %d runs first, with no new data: the no-data batch owed since the last run (%s)", what,
             owed.batch_id, "its watermark had moved" if owed.because == "watermark" else "processing-time timers")
    return owed.batch_id


def _stop(spark: "SparkSession", query: Any, listener: MetricsListener, checkpoint: str | None,
          trigger_ms: int) -> None:
    """Stop after the running micro-batch and the no-data batch it made owed (it starts within a trigger
    interval); let the listener record the last batch before totals are read."""

    def owed() -> int | None:
        try:
            due = owed_batch(checkpoint, spark, processing_time=False) if checkpoint else None
        except (OSError, SparkStateError):  # the logs cannot be read from here: a restart runs it
            return None
        return None if due is None else due.batch_id

    stop_after_current_batch(query, wait_s=STOP_WAIT_S + trigger_ms / 1000, owed=owed)
    last = query.lastProgress
    listener.wait_for(query, None if last is None else last["batchId"], timeout_s=5.0)  # a dict on PySpark 3.5


def _result(config: JobConfig, job: _Job, t: RunTotals, query_id: str, stopped_by: StoppedBy,
            keys_left: int | None, seconds: float) -> JobResult:
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
        sink=redact(str(job.sink)),
        deadletter=None if job.dead_sink is None else redact(str(job.dead_sink)),
        checkpoint=config.checkpoint,
        metrics=config.metrics,
        query_id=query_id,
        seconds=round(seconds, 1),
        late_events=(t.late or 0) if job.refuses else None,
        keys_in_state=keys_left,
    )


def _keys_in_state(spark: "SparkSession", checkpoint: str) -> int | None:
    """Keys left in the checkpoint's state (``None`` when it cannot be read)."""
    from ..state.read import keys

    try:
        return keys(spark, checkpoint)
    except Exception as exc:  # a report, not a reason to fail a run whose output is written
        log.warning("run: could not count the keys left in state in %s: %s", checkpoint, exc)
        return None


__all__ = ["JobResult", "run_pipeline"]
