"""Streaming jobs: a pipeline between a source and a sink, as one library call.

``sparkstate run`` parses its flags into a :class:`JobConfig` (:func:`load_config`: flags >
``SPARKSTATE_*`` environment > config file > defaults) and calls :func:`run_pipeline`.

>>> from sparkstate.jobs import JobConfig, run_pipeline
>>> JobConfig("sessionize", source="files:in", once=True).time_mode
'event'
"""

from ..owed_batch import OwedBatch, owed_batch, queue_owed_batch
from .config import PIPELINE_NAMES, JobConfig, check_here, load_config, read_config_file, read_env
from .control import JobFailedError, is_caught_up, stop_after_current_batch, wait_until_caught_up
from .pipelines import JOB_PIPELINES, JobPipeline, read_initial_state
from .run import JobResult, run_pipeline

__all__ = [
    "JOB_PIPELINES",
    "JobConfig",
    "JobFailedError",
    "JobPipeline",
    "JobResult",
    "OwedBatch",
    "PIPELINE_NAMES",
    "check_here",
    "is_caught_up",
    "load_config",
    "owed_batch",
    "queue_owed_batch",
    "read_config_file",
    "read_env",
    "read_initial_state",
    "run_pipeline",
    "stop_after_current_batch",
    "wait_until_caught_up",
]
