"""A job's checkpoint marker: which pipeline (and the settings it keeps) made a checkpoint.

``CHECKPOINT/_sparkstate_job.json`` is written before a job's first batch
(:func:`write_marker`) and read before anything else on every later run
(:func:`check_checkpoint`), on any filesystem Spark reaches (:mod:`sparkstate.fs`). It also
says whether the query gives the pipeline the source's malformed records (:data:`ONE_READ`,
:func:`reads_once`): Spark refuses to go on with a query that scans its source another number
of times than its checkpoint's first batch did.
"""

from __future__ import annotations

import errno
import json
import logging
from typing import TYPE_CHECKING

from .. import fs
from ..errors import ConfigError, JobFailedError, StateSchemaError
from ..owed_batch import planned_sources
from .config import JobConfig
from .pipelines import JOB_PIPELINES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkstate.jobs")

#: The file in a job's checkpoint that says which pipeline (and time mode) made it.
JOB_MARKER = "_sparkstate_job.json"
#: The marker's key saying that the query reads its source once, the pipeline refusing the malformed
#: records itself (:attr:`~sparkstate.jobs.pipelines.Refusals.malformed`); absent: the query read the
#: dead letters beside the pipeline, as every job did before 2026-11-28.
ONE_READ = "one_read"


def _stored(config: JobConfig, spark: "SparkSession | None") -> dict | None:
    """The checkpoint's marker, or ``None`` when it has none."""
    assert config.checkpoint
    path = fs.join(config.checkpoint, JOB_MARKER)
    if not fs.exists(path, spark):
        return None
    try:
        stored = json.loads(fs.read_text(path, spark))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"run: cannot read {path} ({exc}); is {config.checkpoint} a sparkstate checkpoint?") from None
    return stored if isinstance(stored, dict) else {}


def reads_once(config: JobConfig, spark: "SparkSession | None" = None) -> bool:
    """Whether the job's query may read its source once, giving the pipeline the malformed records
    (when the pipeline refuses them itself): on a checkpoint without a planned batch, or one whose
    marker says :data:`ONE_READ`. A checkpoint of a query that read the dead letters beside the
    pipeline goes on so."""
    if not config.checkpoint:
        return True
    try:
        if planned_sources(config.checkpoint, spark) is None:
            return True
        stored = _stored(config, spark)
    except fs.FsUnavailable as exc:  # Spark Connect, a store this process cannot reach: a new checkpoint's plan
        log.warning("run: the job marker of %s was not read (%s); the query reads its source once, as on a new"
                    " checkpoint", config.checkpoint, exc)
        return True
    return bool(stored and stored.get(ONE_READ))


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
    except fs.FsUnavailable as exc:  # Spark Connect, a store this process cannot reach: Spark's own checks remain
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


def write_marker(config: JobConfig, spark: "SparkSession | None" = None, *, one_read: bool = False) -> None:
    """Write the marker of ``config``'s pipeline into its checkpoint (with :data:`ONE_READ` when the
    query reads its source once), unless the checkpoint has one and a planned batch."""
    if not config.checkpoint:
        return
    path = fs.join(config.checkpoint, JOB_MARKER)
    try:
        if fs.exists(path, spark) and planned_sources(config.checkpoint, spark) is not None:
            return
        marker = JOB_PIPELINES[config.pipeline].marker_of(config) | ({ONE_READ: True} if one_read else {})
        fs.write_text(path, json.dumps(marker) + "\n", spark)
    except fs.FsUnavailable as exc:
        log.warning("run: the job marker of %s was not written: %s", config.checkpoint, exc)
    except OSError as exc:
        full = " (its disk is full: free space and run the job again)" if exc.errno == errno.ENOSPC else ""
        raise JobFailedError(f"run: cannot write {path}: {exc.strerror or exc}{full}") from None


__all__ = ["JOB_MARKER", "ONE_READ", "check_checkpoint", "reads_once", "write_marker"]
