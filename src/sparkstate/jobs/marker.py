"""A job's checkpoint marker: which pipeline (and the settings it keeps) made a checkpoint.

``CHECKPOINT/_sparkstate_job.json`` is written before a job's first batch
(:func:`write_marker`) and read before anything else on every later run
(:func:`check_checkpoint`), on any filesystem Spark reaches (:mod:`sparkstate.fs`).
"""

from __future__ import annotations

import errno
import json
import logging
from typing import TYPE_CHECKING

from .. import fs
from ..errors import ConfigError, JobFailedError, StateSchemaError
from .config import JobConfig
from .pipelines import JOB_PIPELINES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkstate.jobs")

#: The file in a job's checkpoint that says which pipeline (and time mode) made it.
JOB_MARKER = "_sparkstate_job.json"


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


def write_marker(config: JobConfig, spark: "SparkSession | None" = None) -> None:
    """Write the marker of ``config``'s pipeline into its checkpoint, unless one is there."""
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


__all__ = ["JOB_MARKER", "check_checkpoint", "write_marker"]
