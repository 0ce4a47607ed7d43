"""``run_pipeline``: a source, a pipeline, a sink and a dead-letter sink, as one library call.

What ``sparkstate run`` does::

    check   the checkpoint: made by this pipeline (its marker file), state that fits   nothing written yet
    pipeline = JOB_PIPELINES[config.pipeline]   its declaration: schema, output mode, refusals, marker
    source  = open_source(spark, config.source, schema=<the pipeline's>, fmt=config.format)
    output  = <pipeline>(source.events, ...)        validated here; rows it refuses carry a reason
    query   = ONE streaming query on  output ∪ source.dead_letters,  checkpoint CHECKPOINT
              foreachBatch: output rows -> the sink, dead letters (malformed + refused) -> the dead-letter sink
    MetricsListener: one JSON line per batch -> config.metrics, on_batch -> display
    then: config.once -> wait until caught up; else run until Ctrl-C or a failure
    finally: the query stops after its running micro-batch has committed

One query, because only the stateful operator knows the watermark of a micro-batch, so only
it can tell a late event, and a query has one sink: :class:`~sparkstate.jobs.tee.JobTee`
writes each batch's two parts, each sink exactly once per batch id (see
:mod:`sparkstate.jobs.tee`). Every record read is then in exactly one place: an output row's
input, or a dead letter with its reason. Counts come from ``DataFrame.observe`` (records in,
rows out, dead letters, late events), so they are exact whatever the sink.
"""

from __future__ import annotations

import errno
import json
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
from ..errors import ConfigError, JobFailedError, StateSchemaError
from ..io.parse import DEAD_LETTER_SCHEMA, RAW, REASON, RECEIVED_AT, SOURCE, dead_raw, to_struct
from ..io.sinks import SinkSpec, check_sink_paths, parse_sink
from ..io.sources import open_source
from ..io.writers import batch_writer, describe, file_layout
from ..observe.listener import MetricsListener, OnBatch, add_listener, remove_listener
from ..spark import START_ATTEMPTS, WORKER_NOT_BACK, is_connect, pause_before_attempt, start_query
from ..observe.metrics import DEAD_LETTER_OBSERVATION, INPUT_OBSERVATION, OUTPUT_OBSERVATION, RunTotals, redact
from . import connect_runs
from .config import JobConfig, deadletters_needed, source_options
from .control import stop_after_current_batch, wait_until_caught_up, wait_until_stopped
from .pipelines import JOB_PIPELINES, JobPipeline, Refusals
from .tee import DEAD, OUT, JobTee

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("sparkstate.jobs")

#: The file in a job's checkpoint that says which pipeline (and time mode) made it.
JOB_MARKER = "_sparkstate_job.json"

StoppedBy = Literal["caught_up", "interrupted", "stopped"]


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


# --- the checkpoint: whose is it? ----------------------------------------------------------------

def check_checkpoint(config: JobConfig, spark: "SparkSession | None" = None) -> None:
    """Refuse a checkpoint another job made, before anything is read or written.

    A job's checkpoint holds :data:`JOB_MARKER` (its pipeline and the settings the pipeline
    declares kept, :attr:`~sparkstate.jobs.pipelines.JobPipeline.marker`: sessionize's time
    mode); another pipeline's checkpoint would hand this one state it cannot read, and source
    offsets that may not be its own. A checkpoint with a query's progress but no marker was made
    by something else (a query of your own, or a job of an earlier sparkstate): the pipeline's
    state check (``checkpoint=``) still refuses state that does not fit. On any filesystem Spark
    reaches (:mod:`sparkstate.fs`).
    """
    if not config.checkpoint:
        return
    path = fs.join(config.checkpoint, JOB_MARKER)
    try:
        if not fs.exists(path, spark):
            return
        stored = json.loads(fs.read_text(path, spark))
    except fs.FsUnavailable as exc:  # Spark Connect, a store this process cannot reach: Spark's own checks remain
        log.warning("run: the job marker of %s was not checked: %s", config.checkpoint, exc)
        return
    except (OSError, ValueError) as exc:
        raise ConfigError(f"run: cannot read {path} ({exc}); is {config.checkpoint} a sparkstate checkpoint?") from None
    pipeline = JOB_PIPELINES[config.pipeline]
    want = pipeline.marker_of(config)
    if stored.get("pipeline") != want["pipeline"]:
        raise StateSchemaError(
            f"run: the checkpoint {config.checkpoint} belongs to a {stored.get('pipeline')} job, and this job runs"
            f" {config.pipeline}: its state and source offsets are not this pipeline's. Nothing was written. Use a"
            f" new --checkpoint for {config.pipeline} (or run {stored.get('pipeline')} on this one)."
        )
    for kept in pipeline.marker:
        have = stored.get(kept.setting, want[kept.setting])
        if have != want[kept.setting]:
            why = kept.why.format(stored=have, want=want[kept.setting], pipeline=config.pipeline)
            raise StateSchemaError(f"run: the checkpoint {config.checkpoint} {why}. Nothing was written. Use"
                                   f" --{kept.setting.replace('_', '-')} {have}, or a new --checkpoint.")


def _write_marker(config: JobConfig, spark: "SparkSession | None" = None) -> None:
    if not config.checkpoint:
        return
    path = fs.join(config.checkpoint, JOB_MARKER)
    try:
        if fs.exists(path, spark):
            return
        fs.write_text(path, json.dumps(JOB_PIPELINES[config.pipeline].marker_of(config)) + "\n", spark)
    except fs.FsUnavailable as exc:
        log.warning("run: the job marker of %s was not written: %s", config.checkpoint, exc)
    except OSError as exc:
        full = " (its disk is full: free space and run the job again)" if exc.errno == errno.ENOSPC else ""
        raise JobFailedError(f"run: cannot write {path}: {exc.strerror or exc}{full}") from None


# --- the one query -------------------------------------------------------------------------------

def _events(source: Any, pipeline: JobPipeline) -> "DataFrame":
    """The good records for the pipeline; a rejecting one also gets each record's raw text and origin."""
    if pipeline.rejects and source.checked is not None:
        cols = [F.col(f"`{n}`") for n in source.schema.fieldNames()]
        return source.checked.where(F.col(REASON).isNull()).select(*cols, F.col(RAW), F.col(SOURCE))
    return source.events


def _refused_as_dead(output: "DataFrame", refusals: Refusals, key: str, origin: str) -> "Column":
    """A refused output row (non-null ``refusals.column``) as a dead letter (raw, raw_bytes, reason, source,
    received_at).

    ``raw`` is the record as read when the pipeline carried it, else the refused event as JSON
    (``key`` is the output's key column); ``source`` where it came from, else ``origin``.
    """
    col = refusals.column
    names = output.schema[col].dataType.fieldNames()  # type: ignore[attr-defined]
    raw = F.to_json(F.struct(F.col(key), *[F.col(f"{col}.`{n}`") for n in refusals.event]))
    if RAW in names:
        raw = F.coalesce(F.col(f"{col}.`{RAW}`"), raw)
    where = F.col(f"{col}.`{SOURCE}`") if SOURCE in names else F.lit(None).cast("string")
    text, data = dead_raw(raw)
    return F.struct(
        text.alias("raw"),
        data.alias("raw_bytes"),
        F.col(f"{col}.`{refusals.reason}`").alias("reason"),
        F.coalesce(where, F.lit(origin)).alias("source"),
        F.current_timestamp().alias(RECEIVED_AT),
    )


def _refusals(output: "DataFrame", pipeline: JobPipeline) -> Refusals | None:
    """The pipeline's :class:`Refusals` when its output has that struct column, else ``None``."""
    r = pipeline.refusals
    if r is None or r.column not in output.columns or not isinstance(output.schema[r.column].dataType, StructType):
        return None
    return r


def _output_counts(refusals: Refusals | None, is_out: "Column", pipeline: JobPipeline) -> list["Column"]:
    """What the job observes on the output: rows, the pipeline's own counts, refused and late records."""
    counts = [F.count(F.when(is_out, 1)).alias("rows")] + (pipeline.observe() if pipeline.observe else [])
    if refusals is not None:
        counts.append(F.count(F.col(refusals.column)).alias("rejected"))
        if refusals.late:
            reason = F.col(f"{refusals.column}.`{refusals.reason}`")
            counts.append(F.count(F.when(reason.startswith(refusals.late), 1)).alias("late"))
    return counts


def _tee_input(output: "DataFrame", dead_letters: "DataFrame | None", pipeline: JobPipeline,
               origin: str) -> tuple["DataFrame", StructType, bool]:
    """The job's one streaming DataFrame (:data:`OUT` | :data:`DEAD` per row), the output's schema,
    and whether the pipeline may refuse records."""
    refusals = _refusals(output, pipeline)
    out_cols = [c for c in output.columns if refusals is None or c != refusals.column]
    is_out = F.col(refusals.column).isNull() if refusals is not None else F.lit(True)
    output = output.observe(OUTPUT_OBSERVATION, *_output_counts(refusals, is_out, pipeline))
    out_schema = StructType([output.schema[c] for c in out_cols])
    dead_col = (F.when(~is_out, _refused_as_dead(output, refusals, out_cols[0], origin)) if refusals is not None
                else F.lit(None).cast(to_struct(DEAD_LETTER_SCHEMA)))
    combined = output.select(F.when(is_out, F.struct(*[F.col(f"`{c}`") for c in out_cols])).alias(OUT),
                             dead_col.alias(DEAD))
    if dead_letters is not None:
        dead = _observed_dead_letters(dead_letters)
        combined = combined.unionByName(dead.select(F.lit(None).cast(out_schema).alias(OUT),
                                                    F.struct(*[F.col(c) for c in dead.columns]).alias(DEAD)))
    return combined, out_schema, refusals is not None


def _observed_dead_letters(dead_letters: "DataFrame") -> "DataFrame":
    """The source's dead letters, counted (:data:`DEAD_LETTER_OBSERVATION`).

    ``received_at`` is the micro-batch's time, a literal Spark writes into the generated code. Put
    in after the observation (a boundary between generated stages), it leaves the code of the
    parse stage the same in every batch: compiled once, not in every batch (see
    docs/bench/2026-11-26-driver-per-batch.md).
    """
    counted = dead_letters.drop(RECEIVED_AT).observe(DEAD_LETTER_OBSERVATION, F.count(F.lit(1)).alias("rows"))
    if RECEIVED_AT not in dead_letters.columns:
        return counted
    return counted.withColumn(RECEIVED_AT, F.current_timestamp()).select(*dead_letters.columns)


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
    events = _events(source, pipeline).observe(INPUT_OBSERVATION, F.count(F.lit(1)).alias("rows"))
    output = pipeline.build(events, config, spark)  # checks the state in the checkpoint (checkpoint=)
    combined, out_schema, refuses = _tee_input(output, source.dead_letters, pipeline, str(source.spec))
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
    return JobTee(writer, dead_writer)


def run_pipeline(spark: "SparkSession", config: JobConfig, *, on_batch: OnBatch | None = None) -> JobResult:
    """Run ``config``'s pipeline from its source to its sink; return when it is done.

    With ``config.once`` it returns once the input available at the start (and the timers it
    makes due) is processed; otherwise it runs until Ctrl-C (``KeyboardInterrupt``, which it
    handles: the running micro-batch commits, then the query stops) or until the query fails
    (:class:`~sparkstate.jobs.control.JobFailedError`, whose message is one line: for a state
    function that raised, its exception and the key). Bad settings, and a checkpoint made by
    another pipeline or holding state that does not fit, raise a
    :class:`~sparkstate.errors.SparkStateError` before anything is written. ``on_batch(metrics,
    totals)`` is called on Spark's listener thread after every batch. Relative local paths were
    made absolute from this process's directory when ``config`` was made (:class:`JobConfig`).
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
    tee = _tee(spark, job)
    _write_marker(config, spark)
    listener = MetricsListener(config.metrics, on_batch)
    add_listener(spark, listener)
    query = None
    try:
        writer = (job.combined.writeStream.outputMode(job.pipeline.output_mode).foreachBatch(tee)
                  .option("checkpointLocation", job.checkpoint).trigger(processingTime=f"{job.trigger_ms} milliseconds")
                  .queryName(job.name))
        for attempt in range(1, START_ATTEMPTS + 1):
            query = start_query(writer, what)
            listener.watch(query, "output")
            try:
                stopped_by = _wait(query, config.once)
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
        try:
            if query is not None:
                _stop(query, listener)
        finally:
            remove_listener(spark, listener)
            listener.close()
            # (not while an error propagates: the run failed, nothing will be reported)
            keys_left = _keys_in_state(spark, job.checkpoint) if sys.exc_info()[0] is None else None
            if job.own_checkpoint:
                shutil.rmtree(job.checkpoint, ignore_errors=True)
    return _result(config, job, listener.totals, str(query.id), stopped_by, keys_left, time.monotonic() - started)


def _wait(query: Any, once: bool) -> StoppedBy:
    """Wait until the query is caught up (``once``), stopped, failed (raises) or interrupted (Ctrl-C)."""
    try:
        if once:
            wait_until_caught_up([("query", query)])
            return "caught_up"
        wait_until_stopped([("query", query)])
        return "stopped"
    except KeyboardInterrupt:
        return "interrupted"


def _worker_not_back(query: Any) -> bool:
    """Whether ``query`` failed because a Python process Spark started did not connect back in time."""
    exc = query.exception()
    return exc is not None and WORKER_NOT_BACK in str(exc)


def _stop(query: Any, listener: MetricsListener) -> None:
    """Stop after the running micro-batch; let the listener record the last batch before totals are read."""
    stop_after_current_batch(query)
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


__all__ = ["JOB_MARKER", "JobResult", "check_checkpoint", "run_pipeline"]
