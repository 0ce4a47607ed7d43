"""The pipelines ``sparkstate run`` knows, each declared in one place: :data:`JOB_PIPELINES`.

A declaration (:class:`JobPipeline`) is all the job runner (:func:`~sparkstate.jobs.run_pipeline`),
the settings (:mod:`sparkstate.jobs.config`) and the CLI (``sparkstate run``) know of a
pipeline: its input schema, output mode, the settings it reads, the records it may refuse
and what its checkpoint marker records. Adding a pipeline is one entry here (its builder
passes ``checkpoint=`` so that state that does not fit is refused before the query starts).

>>> sorted(JOB_PIPELINES)
['first-last-activity', 'running-count', 'sessionize', 'visited-pages']
>>> JOB_PIPELINES["sessionize"].output_mode, JOB_PIPELINES["running-count"].output_mode
('append', 'update')
>>> JOB_PIPELINES["sessionize"].columns
['user_id', 'event_time', 'data', 'is_last']
>>> from sparkstate.jobs import JobConfig
>>> JOB_PIPELINES["sessionize"].marker_of(JobConfig("sessionize", source="files:in"))
{'pipeline': 'sessionize', 'time_mode': 'event'}
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pyspark.sql import functions as F

from .. import fs
from ..ddl import column_names
from ..compile import choose_engine
from ..engines import DEFAULT_ENGINE, BatchedEngine, default_engine
from ..engines.checkpoint import written_by
from ..engines.runtime import TRANSFORM_WITH_STATE_IN_PANDAS
from ..errors import ConfigError
from ..io.parse import RAW, REASON, SOURCE
# Each function from its own module: the package re-exports them under their modules' names,
# so `from ..pipelines import sessionize` and `from ..pipelines.sessionize import ...` disagree.
from ..pipelines.first_last_activity import first_last_activity
from ..pipelines.refusals import REJECTED
from ..pipelines.running_count import running_count
from ..pipelines.sessionize import LATE_PREFIX, TIME_MODES, sessionize
from ..pipelines.visited_pages import PAGES_COLUMN, visited_pages
from ..synthetic.generator import EVENT_SCHEMA
from .settings import Setting, SettingValues, initial_state_path

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


log = logging.getLogger("sparkstate.jobs")


@dataclass(frozen=True)
class Refusals:
    """How a pipeline's output carries the records it refuses (the job writes them to its dead letters).

    ``column``: a struct column of the output, null on output rows, whose field ``reason`` says
    why. ``event``: its fields that hold the refused event; with the output's first column (the
    key) they make the dead letter's ``raw`` text when the record's own text is not carried.
    ``late``: how the reasons of records refused as late begin (counted as ``late_events``).
    ``malformed(config)``: whether, with these settings, the pipeline refuses the source's
    malformed records itself: it is given every record, with the parse's reason in
    :data:`~sparkstate.io.parse.REASON` (null on a good one), and they come out among its
    refusals, so that the job's query reads the source once (``None``: never; the query reads
    the source's dead letters beside the pipeline). ``own``: whether the pipeline refuses records
    of its own (late ones, ...); one that refuses only malformed records is given the plain
    events when the dead letters are read beside it, and each record's raw bytes and origin
    only on the records it refuses.
    """

    column: str
    event: tuple[str, ...]
    late: str | None = None
    reason: str = "reason"
    malformed: Callable[[SettingValues], bool] | None = None
    own: bool = True


@dataclass(frozen=True)
class Kept:
    """A setting a pipeline's checkpoint records (its marker file), which a restart must keep.

    ``why`` says what would go wrong, with ``{stored}``, ``{want}`` and ``{pipeline}`` filled in.
    """

    setting: str
    why: str


@dataclass(frozen=True)
class JobPipeline:
    """How a job runs one pipeline.

    ``schema``: the records the source must deliver (DDL). ``output_mode``: what the pipeline
    emits: ``append`` (each row final: sessions) or ``update`` (a key's latest value, again
    each time it changes). ``build(events, config, spark)`` defines the output DataFrame (its
    first column is the key), checking the state in ``config.checkpoint``.
    ``output_label`` names the output rows in progress displays; ``observe`` adds counts of
    the output (beyond its row count) to the per-batch metrics. ``refusals``: the output may
    hold records the pipeline refused (:class:`Refusals`); such a pipeline is given the events
    with their raw text and origin (:data:`CARRY`) to copy into them. ``settings``: the
    pipeline's own settings (:class:`~sparkstate.jobs.settings.Setting`), declared here once:
    flag, variable, file key, help and check come from them; a job of another pipeline ignores
    them. ``check(config)``: refuses (:class:`~sparkstate.errors.ConfigError`) a combination of
    settings the pipeline cannot run with, before Spark starts. ``marker``: the
    settings its checkpoint records, which a restart must keep
    (:func:`~sparkstate.jobs.marker.check_checkpoint`). ``processing_timers(config)``: whether its
    operator has processing-time timers with these settings; Spark then runs a batch at every
    trigger, data or not, so such a job's trigger is never 0 by default
    (:func:`~sparkstate.jobs.config.default_trigger`). ``packs_streamed``: whether a job of it
    packs its input by default when the source streams records as they come (``kafka:``,
    ``socket:``; :func:`~sparkstate.jobs.config.default_pack`): there batches are small, and
    packing's Python stage before the shuffle is time added to each of them.
    """

    name: str
    schema: str
    output_mode: str
    build: Callable[["DataFrame", SettingValues, "SparkSession"], "DataFrame"]
    output_label: str = "rows emitted"
    observe: Callable[[], list["Column"]] | None = None
    refusals: Refusals | None = None
    settings: tuple[Setting, ...] = ()
    check: Callable[[SettingValues], None] | None = None
    marker: tuple[Kept, ...] = ()
    processing_timers: Callable[[SettingValues], bool] | None = None
    packs_streamed: bool = True

    @property
    def rejects(self) -> bool:
        """Whether the output may hold refused records."""
        return self.refusals is not None

    @property
    def columns(self) -> list[str]:
        """The input columns, from :attr:`schema`."""
        return column_names(self.schema)

    def marker_of(self, config: SettingValues) -> dict[str, Any]:
        """What a checkpoint of this pipeline records (``_sparkstate_job.json``)."""
        return {"pipeline": self.name, **{k.setting: getattr(config, k.setting) for k in self.marker}}


#: Input columns a rejecting pipeline copies into the records it refuses (raw text, origin).
CARRY = (RAW, SOURCE)


def _sessionize(events: "DataFrame", cfg: SettingValues, spark: "SparkSession") -> "DataFrame":
    # Late events (and, with max_future_skew, far-future ones) come out with a reason; nothing is dropped.
    return sessionize(events, gap=cfg.gap, time_mode=cfg.time_mode, watermark=cfg.watermark,
                      engine=_engine(cfg, spark), late="emit", carry=[c for c in CARRY if c in events.columns],
                      reason=REASON if REASON in events.columns else None,  # event time: Refusals.malformed
                      max_future_skew=cfg.max_future_skew,  # event time only: _check_sessionize
                      checkpoint=cfg.checkpoint, emit_on_last=cfg.emit_on_last,
                      initial_state=_initial(spark, cfg, None))


def _refusing(events: "DataFrame") -> dict[str, Any]:
    """``reason=`` and ``carry=`` for an update-mode pipeline given the parse's reasons
    (:data:`MALFORMED_ONLY`: the query reads its source once), else nothing."""
    if REASON not in events.columns:
        return {}
    return {"reason": REASON, "carry": [c for c in CARRY if c in events.columns]}


def _engine(cfg: SettingValues, spark: "SparkSession") -> "str | BatchedEngine | None":
    """The ``engine=`` of the job's operator. ``None``: the engine that wrote the checkpoint's
    state, else the default (:func:`sparkstate.compile.choose_engine`). Without packing: the batched
    engine without its packing step, when ``--no-pack`` was given (:func:`check_pack` refuses it
    beside another engine) or when the job runs on the batched engine anyway (the pipeline's
    default, :func:`~sparkstate.jobs.config.default_pack`, says nothing about other engines)."""
    if cfg.pack:
        return cfg.engine
    if cfg.given("pack") or choose_engine(cfg.engine, written_by(spark, cfg.checkpoint)).name == DEFAULT_ENGINE:
        return BatchedEngine(pack=False)
    return cfg.engine


def check_pack(cfg: SettingValues) -> None:
    """Refuse ``pack=False`` (``--no-pack``) on a job whose engine does not pack by choice: only
    the batched engine's packing step can be left out. A pipeline's default never is."""
    if cfg.pack or not cfg.given("pack"):
        return
    engine = cfg.engine or default_engine()
    if engine == DEFAULT_ENGINE:
        return
    if cfg.engine is None:
        minor = ".".join(map(str, TRANSFORM_WITH_STATE_IN_PANDAS))
        raise ConfigError(f"run: --no-pack leaves out the batched engine's packing step, and the batched engine"
                          f" needs PySpark {minor}+; this PySpark runs the {engine} engine, which always packs"
                          " (drop --no-pack)")
    raise ConfigError(f"run: --no-pack applies to the batched engine, and this job runs on the {engine} engine"
                      " (drop --no-pack, or use --engine batched)")


def _timed_out() -> list["Column"]:
    # count, not sum: a batch without output rows observes 0, not null
    return [F.count(F.when(F.col("closed_by") == "timeout", 1)).alias("timed_out")]


INITIAL_STATE_SCHEMA = f"user_id string, {PAGES_COLUMN} array<string>"


def read_initial_state(spark: "SparkSession", path: str, schema: str | None = INITIAL_STATE_SCHEMA) -> "DataFrame":
    """A job's initial state from Parquet or JSON lines: by default visited-pages' (``user_id``,
    ``visited_pages``); ``schema=None`` reads JSON with the schema Spark infers (the other
    pipelines, whose operator casts each column to its state field's type). Parquet, as
    ``sparkstate state export`` writes it, is read as it is.

    ``json:PATH`` / ``parquet:PATH`` say the format; otherwise ``.json``, ``.jsonl`` and
    ``.ndjson`` (a file, or a directory holding such files) are JSON, anything else Parquet.

    >>> import sparkstate as ss, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "pages.json")
    >>> _ = open(p, "w").write('{"user_id": "a", "visited_pages": ["page1"]}\\n')
    >>> read_initial_state(ss.spark_session(), p).collect()
    [Row(user_id='a', visited_pages=['page1'])]
    """
    given, target = initial_state_path(path)
    if given is not None:
        fmt = given
    else:
        target, fmt = path, "parquet"
        try:
            if not fs.exists(path, spark):
                raise ConfigError(f"run: the initial state {path} does not exist")
            names = fs.list_names(path, spark) if fs.is_dir(path, spark) else [path.rstrip("/").rsplit("/", 1)[-1]]
        except fs.FsUnavailable as exc:  # Spark Connect on a store this process cannot reach: Spark reads it
            log.warning("run: the initial state %s was not looked at (%s); reading it as Parquet", path, exc)
            names = []
        if any(n.lower().endswith((".json", ".jsonl", ".ndjson")) for n in names):
            fmt = "json"
    try:
        if fmt == "json":
            reader = spark.read.schema(schema) if schema else spark.read
            return reader.json(target)
        return spark.read.parquet(target)
    except Exception as exc:
        raise ConfigError(f"run: cannot read the initial state {path} as {fmt}: {str(exc).splitlines()[0]}") from None


def _initial(spark: "SparkSession", cfg: SettingValues, schema: str | None) -> "DataFrame | None":
    # The initial state applies when the checkpoint is new; the operator ignores it on a restart.
    return read_initial_state(spark, cfg.initial_state, schema) if cfg.initial_state else None


def _visited_pages(events: "DataFrame", cfg: SettingValues, spark: "SparkSession") -> "DataFrame":
    return visited_pages(events, initial_state=_initial(spark, cfg, INITIAL_STATE_SCHEMA), engine=_engine(cfg, spark),
                         checkpoint=cfg.checkpoint, **_refusing(events))


#: How an update-mode pipeline refuses: only the source's malformed records, always in the query's
#: one read of its source (:mod:`sparkstate.pipelines.refusals`).
MALFORMED_ONLY = Refusals(REJECTED, (), malformed=lambda cfg: True, own=False)


#: The settings sessionize reads (a job of another pipeline ignores them).
SESSIONIZE_SETTINGS = (
    Setting("gap", "inactivity that ends a session", "1 minute", kind="duration", metavar="DURATION"),
    Setting("time_mode", "the clock that times sessions out: event (the events' own timestamps, with a watermark)"
                         " or processing (this machine's clock; late events do not exist)", "event", kind="choice",
            choices=TIME_MODES),
    Setting("watermark", "event time: allowed lateness; an event older than the latest event time minus this"
                         " goes to the dead letters", "10 seconds", kind="delay", metavar="DURATION"),
    Setting("max_future_skew", "event time: events more than this ahead of the processing time go to the dead"
                               " letters instead of moving the watermark (default: no limit)", kind="duration",
            metavar="DURATION"),
    Setting("emit_on_last", "event time: write a session ending with an is_last event at once, not when the"
                            " watermark passes it (only correct for input in event-time order; default: off)",
            False, kind="bool"),
)


def _check_sessionize(cfg: SettingValues) -> None:
    if cfg.time_mode == "event":
        return
    for name in ("watermark", "max_future_skew", "emit_on_last"):
        if cfg.given(name) and getattr(cfg, name):
            flag = name.replace("_", "-")
            raise ConfigError(f"run: --{flag} applies to --time-mode event; processing time has no watermark"
                              f" (drop --{flag}, or use --time-mode event)")


JOB_PIPELINES: dict[str, JobPipeline] = {
    p.name: p
    for p in (
        JobPipeline(
            "sessionize", EVENT_SCHEMA, "append", _sessionize, "sessions emitted", _timed_out,
            refusals=Refusals(REJECTED, ("event_time", "data", "is_last"), late=LATE_PREFIX,
                              malformed=lambda cfg: cfg.time_mode == "event"),
            settings=SESSIONIZE_SETTINGS, check=_check_sessionize,
            processing_timers=lambda cfg: cfg.time_mode == "processing", packs_streamed=False,
            marker=(Kept("time_mode", "holds {stored}-time {pipeline} state, and this job runs in {want} time: its"
                                      " pending timeouts would be read on the wrong clock"),),
        ),
        JobPipeline(
            "first-last-activity", "user string, timestamp timestamp, activity string", "update",
            lambda events, cfg, spark: first_last_activity(events, engine=_engine(cfg, spark), checkpoint=cfg.checkpoint,
                                                           initial_state=_initial(spark, cfg, None),
                                                           **_refusing(events)),
            "spans emitted", refusals=MALFORMED_ONLY,
        ),
        JobPipeline(
            "running-count", "word string", "update",
            lambda events, cfg, spark: running_count(events, engine=_engine(cfg, spark), checkpoint=cfg.checkpoint,
                                                     initial_state=_initial(spark, cfg, None), **_refusing(events)),
            "counts emitted", refusals=MALFORMED_ONLY,
        ),
        JobPipeline("visited-pages", "user_id string, page string", "update", _visited_pages, "lists emitted",
                    refusals=MALFORMED_ONLY),
    )
}

__all__ = ["CARRY", "INITIAL_STATE_SCHEMA", "JOB_PIPELINES", "MALFORMED_ONLY", "JobPipeline", "Kept", "Refusals",
           "SESSIONIZE_SETTINGS", "check_pack", "read_initial_state"]
