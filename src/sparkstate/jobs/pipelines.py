"""The pipelines ``sparkstate run`` knows: their input schema, output mode and how to build them.

>>> sorted(JOB_PIPELINES)
['first-last-activity', 'running-count', 'sessionize', 'visited-pages']
>>> JOB_PIPELINES["sessionize"].output_mode, JOB_PIPELINES["running-count"].output_mode
('append', 'update')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from pyspark.sql import functions as F

from ..engines import DEFAULT_ENGINE
from ..errors import ConfigError
from ..synthetic.generator import EVENT_SCHEMA
from ..io.parse import RAW, SOURCE
from ..pipelines import first_last_activity, running_count, sessionize, visited_pages
from ..pipelines.visited_pages import PAGES_COLUMN
from .config import JobConfig

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


@dataclass(frozen=True)
class JobPipeline:
    """How a job runs one pipeline.

    ``schema``: the records the source must deliver (DDL). ``output_mode``: what the pipeline
    emits: ``append`` (each row final: sessions) or ``update`` (a key's latest value, again
    each time it changes). ``build(events, config, spark)`` defines the output DataFrame.
    ``output_label`` names the output rows in progress displays; ``observe`` adds counts of
    the output (beyond its row count) to the per-batch metrics. ``rejects``: the output may
    hold records the pipeline refused (a non-null struct column ``rejected`` with a ``reason``:
    sessionize's late events), which the job writes to the dead letters; such a pipeline is
    given the events with their raw text and origin (:data:`CARRY`) to copy into them.
    """

    name: str
    schema: str
    output_mode: str
    build: Callable[["DataFrame", JobConfig, "SparkSession"], "DataFrame"]
    output_label: str = "rows emitted"
    observe: Callable[[], list["Column"]] | None = None
    rejects: bool = False


#: Input columns a rejecting pipeline copies into the records it refuses (raw text, origin).
CARRY = (RAW, SOURCE)


def _sessionize(events: "DataFrame", cfg: JobConfig, spark: "SparkSession") -> "DataFrame":
    # Late events (and, with max_future_skew, far-future ones) come out with a reason; nothing is dropped.
    return sessionize(events, gap=cfg.gap, time_mode=cfg.time_mode, watermark=cfg.watermark,  # type: ignore[arg-type]
                      engine=_engine(cfg), late="emit", carry=[c for c in CARRY if c in events.columns],
                      max_future_skew=cfg.max_future_skew if cfg.time_mode == "event" else None,
                      checkpoint=cfg.checkpoint, emit_on_last=cfg.emit_on_last and cfg.time_mode == "event")


def _engine(cfg: JobConfig) -> str:
    return cfg.engine or DEFAULT_ENGINE


def _timed_out() -> list["Column"]:
    # count, not sum: a batch without output rows observes 0, not null
    return [F.count(F.when(F.col("closed_by") == "timeout", 1)).alias("timed_out")]


INITIAL_STATE_SCHEMA = f"user_id string, {PAGES_COLUMN} array<string>"


def read_initial_state(spark: "SparkSession", path: str) -> "DataFrame":
    """visited-pages' initial state from Parquet or JSON lines (``user_id``, ``visited_pages``).

    ``json:PATH`` / ``parquet:PATH`` say the format; otherwise ``.json``, ``.jsonl`` and
    ``.ndjson`` (a file, or a directory holding such files) are JSON, anything else Parquet.

    >>> import sparkstate as ss, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "pages.json")
    >>> _ = open(p, "w").write('{"user_id": "a", "visited_pages": ["page1"]}\\n')
    >>> read_initial_state(ss.spark_session(), p).collect()
    [Row(user_id='a', visited_pages=['page1'])]
    """
    fmt, sep, rest = path.partition(":")
    if sep and fmt in ("json", "parquet"):
        target = rest
    else:
        target, fmt = path, "parquet"
        local = Path(path)
        names = [p.name for p in local.iterdir()] if local.is_dir() else [local.name]
        if any(n.lower().endswith((".json", ".jsonl", ".ndjson")) for n in names):
            fmt = "json"
        if not local.exists() and "://" not in path:
            raise ConfigError(f"run: the initial state {path} does not exist")
    try:
        if fmt == "json":
            return spark.read.schema(INITIAL_STATE_SCHEMA).json(target)
        return spark.read.parquet(target)
    except Exception as exc:
        raise ConfigError(f"run: cannot read the initial state {path} as {fmt}: {str(exc).splitlines()[0]}") from None


def _visited_pages(events: "DataFrame", cfg: JobConfig, spark: "SparkSession") -> "DataFrame":
    initial = read_initial_state(spark, cfg.initial_state) if cfg.initial_state else None
    return visited_pages(events, initial_state=initial, engine=_engine(cfg))


JOB_PIPELINES: dict[str, JobPipeline] = {
    p.name: p
    for p in (
        JobPipeline("sessionize", EVENT_SCHEMA, "append", _sessionize, "sessions emitted", _timed_out, rejects=True),
        JobPipeline(
            "first-last-activity", "user string, timestamp timestamp, activity string", "update",
            lambda events, cfg, spark: first_last_activity(events, engine=_engine(cfg)), "spans emitted",
        ),
        JobPipeline(
            "running-count", "word string", "update",
            lambda events, cfg, spark: running_count(events, engine=_engine(cfg)), "counts emitted",
        ),
        JobPipeline("visited-pages", "user_id string, page string", "update", _visited_pages, "lists emitted"),
    )
}

__all__ = ["CARRY", "INITIAL_STATE_SCHEMA", "JOB_PIPELINES", "JobPipeline", "read_initial_state"]
