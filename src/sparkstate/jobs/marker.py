"""A job's checkpoint marker: which pipeline (and the settings it keeps) made a checkpoint.

``CHECKPOINT/_sparkstate_job.json`` is written before a job's first batch
(:func:`write_marker`) and read before anything else on every later run
(:func:`check_checkpoint`), on any filesystem Spark reaches (:mod:`sparkstate.fs`). Over Spark
Connect, on a store only the server reaches (``dbfs:/``, ``hdfs://`` from a laptop), the server
writes and reads it instead, as the one file of ``CHECKPOINT/sparkstate-job/``
(:data:`SERVER_MARKER`): Spark's file sources never show a name that begins with ``_``.

Whether the query may read its source once, giving the pipeline the malformed records
(:func:`reads_once`), is the checkpoint's own record: Spark refuses to go on with a query that
scans its source another number of times than its checkpoint's offset log has.
"""

from __future__ import annotations

import errno
import json
import logging
from typing import TYPE_CHECKING

from .. import fs
from ..errors import ConfigError, JobFailedError, StateSchemaError, explain
from ..owed_batch import planned_sources
from ..spark import is_connect
from .config import JobConfig
from .pipelines import JOB_PIPELINES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkstate.jobs")

#: The file in a job's checkpoint that says which pipeline (and time mode) made it.
JOB_MARKER = "_sparkstate_job.json"
#: The directory that holds the marker instead where only a Spark Connect server reaches the
#: checkpoint: its one data file (``part-...``), written and read by the session's own file
#: source and writer (:func:`sparkstate.fs.server_write_text`, :func:`sparkstate.fs.server_files`).
SERVER_MARKER = "sparkstate-job"


def _through_server(spark: "SparkSession | None") -> bool:
    """Whether a store this process cannot reach can be read and written by ``spark``'s server."""
    return spark is not None and is_connect(spark)


def _marker_text(checkpoint: str, spark: "SparkSession | None") -> tuple[str, str] | None:
    """(where, text) of the checkpoint's marker, or ``None`` when it has none that can be seen."""
    path = fs.join(checkpoint, JOB_MARKER)
    served = fs.join(checkpoint, SERVER_MARKER)
    try:
        if fs.exists(path, spark):
            return path, fs.read_text(path, spark)
        names = [n for n in fs.list_names(served, spark) if not n.startswith(("_", "."))]
        return (fs.join(served, names[0]), fs.read_text(fs.join(served, names[0]), spark)) if names else None
    except fs.FsUnavailable:
        if not _through_server(spark):
            raise
        assert spark is not None
        texts = sorted(fs.server_files(served, spark).items())
        if texts:
            return fs.join(served, texts[0][0]), texts[0][1]
        if planned_sources(checkpoint, spark) is not None:  # a query ran there: its marker may be JOB_MARKER
            log.warning("run: the job marker of %s was not checked: the Spark Connect server reads only %s/, and a"
                        " job that reached the store directly writes %s", checkpoint, SERVER_MARKER, JOB_MARKER)
        return None


def _stored(config: JobConfig, spark: "SparkSession | None") -> dict | None:
    """The checkpoint's marker, or ``None`` when it has none."""
    assert config.checkpoint
    try:
        found = _marker_text(config.checkpoint, spark)
    except OSError as exc:
        raise ConfigError(f"run: cannot read the job marker of {config.checkpoint} ({exc}); is it a sparkstate"
                          " checkpoint?") from None
    if found is None:
        return None
    where, text = found
    try:
        stored = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"run: cannot read {where} ({exc}); is {config.checkpoint} a sparkstate checkpoint?") from None
    return stored if isinstance(stored, dict) else {}


def reads_once(config: JobConfig, spark: "SparkSession | None" = None) -> bool:
    """Whether the job's query may read its source once, giving the pipeline the malformed records
    (when the pipeline refuses them itself, :attr:`~sparkstate.jobs.pipelines.Refusals.malformed`):
    on a new checkpoint, and on one whose newest planned batch scanned one source. A checkpoint of
    a query that read the dead letters beside the pipeline (two scans: every job before 2026-11-28)
    goes on so."""
    if not config.checkpoint:
        return True
    try:
        return planned_sources(config.checkpoint, spark) in (None, 1)
    except fs.FsUnavailable as exc:  # no session that reaches the store: a new checkpoint's plan
        log.warning("run: the offset log of %s was not read (%s); the query reads its source once, as on a new"
                    " checkpoint", config.checkpoint, exc)
        return True


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
    try:
        stored = _stored(config, spark)
    except fs.FsUnavailable as exc:  # no session that reaches the store: Spark's own checks remain
        log.warning("run: the job marker of %s was not checked: %s", config.checkpoint, exc)
        return
    if stored is None:
        return
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


def write_marker(config: JobConfig, spark: "SparkSession | None" = None) -> None:
    """Write the marker of ``config``'s pipeline into its checkpoint, unless the checkpoint has one
    and a planned batch: where this process reaches the store, as :data:`JOB_MARKER`; else, over
    Spark Connect, through the server into :data:`SERVER_MARKER`, on a checkpoint where no query
    ran yet."""
    if not config.checkpoint:
        return
    text = json.dumps(JOB_PIPELINES[config.pipeline].marker_of(config)) + "\n"
    path = fs.join(config.checkpoint, JOB_MARKER)
    try:
        if fs.exists(path, spark) and planned_sources(config.checkpoint, spark) is not None:
            return
        fs.write_text(path, text, spark)
    except fs.FsUnavailable as exc:
        if not _through_server(spark):
            log.warning("run: the job marker of %s was not written: %s", config.checkpoint, exc)
            return
        assert spark is not None
        served = fs.join(config.checkpoint, SERVER_MARKER)
        try:
            # only on a checkpoint where no query ran: one that ran may hold a JOB_MARKER the server cannot show
            if planned_sources(config.checkpoint, spark) is not None:
                return
            fs.server_write_text(served, text, spark)
        except Exception as failed:  # the server's write: its error, in a sentence
            raise JobFailedError(f"run: the Spark Connect server cannot write {served}: {explain(failed)}") from None
    except OSError as exc:
        full = " (its disk is full: free space and run the job again)" if exc.errno == errno.ENOSPC else ""
        raise JobFailedError(f"run: cannot write {path}: {exc.strerror or exc}{full}") from None


__all__ = ["JOB_MARKER", "SERVER_MARKER", "check_checkpoint", "reads_once", "write_marker"]
