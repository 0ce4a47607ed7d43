"""What a ``sparkstate run`` job is: :class:`JobConfig`, and where its settings come from.

Settings come from four layers, each overriding the one before: built-in defaults, a config
file (YAML or TOML), ``SPARKSTATE_*`` environment variables, and command-line flags.
:func:`load_config` merges them. Names are the flags' long names; in files ``-`` and ``_`` are
the same (``time-mode`` or ``time_mode``); environment variables are ``SPARKSTATE_`` plus the
name in capitals with ``_`` (``SPARKSTATE_TIME_MODE``). A config file names its pipeline as
``pipeline``; reader options are a table ``options`` (file) or ``KEY=VALUE,...`` (variable).

>>> cfg = load_config("running-count", flags={"source": "files:in", "sink": "console"}, env={})
>>> cfg.pipeline, cfg.trigger, cfg.once
('running-count', '1 second', False)
>>> load_config("sessionize", flags={"source": "files:in", "gap": "2 minutes"},
...             env={"SPARKSTATE_GAP": "5 minutes", "SPARKSTATE_ONCE": "yes"}).gap
'2 minutes'
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..durations import positive_ms
from ..errors import ConfigError
from ..paths import absolute_path
from .pipelines import JOB_PIPELINES

if TYPE_CHECKING:
    from ..io.sinks import SinkSpec
    from ..io.sources import SourceSpec

log = logging.getLogger("sparkstate.jobs")

#: The pipelines' names (their declarations: :data:`~sparkstate.jobs.pipelines.JOB_PIPELINES`).
PIPELINE_NAMES: tuple[str, ...] = tuple(JOB_PIPELINES)
FORMATS = ("json", "csv", "parquet")
ENV_PREFIX = "SPARKSTATE_"

#: Pipeline settings that change what a job computes from its first record: given to a pipeline
#: that does not read them, they are refused (the other pipeline settings are ignored, with a warning).
REFUSED_ELSEWHERE: tuple[str, ...] = ()


def _owners(setting: str) -> list[str]:
    """The pipelines that read ``setting`` (empty: every pipeline, a setting of the job)."""
    return [p.name for p in JOB_PIPELINES.values() if setting in p.settings]


@dataclass(frozen=True)
class JobConfig:
    """One streaming job: a pipeline between a source and a sink (see ``sparkstate run --help``).

    ``source``/``sink``/``deadletter`` are spec strings (:func:`sparkstate.io.sources.parse_source`,
    :func:`sparkstate.io.sinks.parse_sink`); ``deadletter=None`` means the sink's default
    (``DIR/_deadletter`` beside a file sink). ``gap``, ``time_mode`` and ``watermark`` are
    sessionize's; ``initial_state`` (a Parquet or JSON path, e.g. what ``sparkstate state export``
    wrote from another checkpoint) is the state every pipeline starts from on a new checkpoint. ``once``: stop
    when the input available at the start is processed. ``options`` go to the source's reader.
    ``master``: the Spark master URL (``spark://HOST:PORT``, ``local[2]``, ...) for a session the
    job starts itself (``None``: ``local[*]``, or what spark-submit configured). ``remote``: a
    Spark Connect server (``sc://HOST:PORT``) to run the job on instead (``None``: the
    ``SPARK_REMOTE`` variable, if set). ``engine``: the
    state engine the pipeline runs on (``None``: the pipeline's default, the fastest).
    ``max_future_skew`` (sessionize, event time): events whose time is more than this ahead of
    the processing time go to the dead letters instead of moving the watermark.
    ``emit_on_last`` (sessionize, event time): write a session that ends with an ``is_last``
    event in the batch that reads it, not once the watermark passes it; only correct for input
    in event-time order (see :func:`sparkstate.pipelines.sessionize`).
    ``packages`` (Maven coordinates, comma-separated) and ``jars`` (local jar paths) go on the
    classpath of a Spark session the job starts itself (``spark.jars.packages``, ``spark.jars``):
    Spark's Kafka connector for ``kafka:`` specs (:func:`sparkstate.io.connectors.kafka_coordinates`).
    ``max_batch_records`` / ``max_batch_files``: the most a micro-batch reads, so that a backlog
    (a source far ahead of the job) is worked off in batches of bounded size and memory instead
    of one huge batch: records for the generator (``maxEventsPerTrigger``) and Kafka
    (``maxOffsetsPerTrigger``), files for a files source (``maxFilesPerTrigger``); ``0`` for no
    limit. A limit given in ``options`` wins (for files, ``maxBytesPerTrigger`` too). A socket
    source cannot be limited.

    >>> JobConfig("running-count", source="files:in").sink
    'console'
    >>> JobConfig("sessions", source="files:in")
    Traceback (most recent call last):
    ...
    sparkstate.errors.ConfigError: run: unknown pipeline 'sessions'; choose one of sessionize, first-last-activity, running-count, visited-pages
    """

    pipeline: str
    source: str
    sink: str = "console"
    checkpoint: str | None = None
    format: str | None = None
    deadletter: str | None = None
    gap: str = "1 minute"
    time_mode: str = "event"
    watermark: str = "10 seconds"
    trigger: str = "1 second"
    initial_state: str | None = None
    metrics: str | None = None
    once: bool = False
    query_name: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    spark_log: str | None = None
    master: str | None = None
    remote: str | None = None
    engine: str | None = None
    max_future_skew: str | None = None
    emit_on_last: bool = False
    packages: str | None = None
    jars: str | None = None
    max_batch_records: int = 100_000
    max_batch_files: int = 100
    # parsed from the three spec strings above by __post_init__
    source_spec: "SourceSpec" = field(init=False, repr=False, compare=False)
    sink_spec: "SinkSpec" = field(init=False, repr=False, compare=False)
    deadletter_spec: "SinkSpec | None" = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("max_batch_records", "max_batch_files"):
            value = getattr(self, name)
            try:
                number = int(str(value).strip().replace("_", "")) if not isinstance(value, bool) else -1
            except ValueError:
                number = -1
            if number < 0:
                raise ConfigError(f"run: {name.replace('_', '-')} is a whole number >= 0 (0: no limit), got {value!r}")
            object.__setattr__(self, name, number)
        if self.pipeline not in JOB_PIPELINES:
            raise ConfigError(f"run: unknown pipeline {self.pipeline!r}; choose one of {', '.join(JOB_PIPELINES)}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ConfigError("run: a source is required: --source SPEC (e.g. files:DIR), SPARKSTATE_SOURCE or"
                              " `source` in the config file")
        if self.format is not None and self.format not in FORMATS:
            raise ConfigError(f"run: format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        try:
            positive_ms(self.trigger, "run: trigger")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.master is not None and (not isinstance(self.master, str) or not self.master.strip()
                                        or any(c.isspace() for c in self.master.strip())):
            raise ConfigError(f"run: master must be a Spark master URL such as spark://HOST:7077 or local[2],"
                              f" got {self.master!r}")
        if self.remote is not None and not (isinstance(self.remote, str) and self.remote.strip().startswith("sc://")):
            raise ConfigError(f"run: remote must be a Spark Connect URL such as sc://HOST:15002, got {self.remote!r}")
        if self.remote is not None and self.master is not None:
            raise ConfigError("run: give either master (Spark started here) or remote (a Spark Connect server), not both")
        if self.engine is not None:
            from ..engines import ENGINES

            if self.engine not in ENGINES:
                raise ConfigError(f"run: engine must be one of {', '.join(sorted(ENGINES))}, got {self.engine!r}")
        for name in REFUSED_ELSEWHERE:
            owners = _owners(name)
            if getattr(self, name) is not None and self.pipeline not in owners:
                raise ConfigError(f"run: --{name.replace('_', '-')} applies to {' and '.join(owners)} only,"
                                  f" not to {self.pipeline}")
        check = JOB_PIPELINES[self.pipeline].check
        if check is not None:
            check(self)
        # The specs are parsed now, before Spark starts (parsing them needs no Spark), and kept.
        from ..io.sinks import parse_sink
        from ..io.sources import parse_source

        object.__setattr__(self, "source_spec", parse_source(self.source))
        object.__setattr__(self, "sink_spec", parse_sink(self.sink))
        object.__setattr__(self, "deadletter_spec", None if self.deadletter is None else parse_sink(self.deadletter))

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain values (``options`` as a dict)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        d["options"] = dict(self.options)
        return d


#: The reader option each source kind's batch limit goes to, and the options that already limit it.
BATCH_LIMITS = {
    "generator": ("max_batch_records", "maxEventsPerTrigger", ("maxEventsPerTrigger",)),
    "kafka": ("max_batch_records", "maxOffsetsPerTrigger", ("maxOffsetsPerTrigger",)),
    "files": ("max_batch_files", "maxFilesPerTrigger", ("maxFilesPerTrigger", "maxBytesPerTrigger")),
}


def source_options(config: JobConfig) -> dict[str, str]:
    """The reader options of ``config``: its ``options`` plus the batch limit of its source kind.

    >>> source_options(JobConfig("running-count", source="kafka:h:9092/t"))
    {'maxOffsetsPerTrigger': '100000'}
    >>> source_options(JobConfig("running-count", source="files:in", options={"maxBytesPerTrigger": "1g"}))
    {'maxBytesPerTrigger': '1g'}
    >>> source_options(JobConfig("running-count", source="generator", max_batch_records=0))
    {}
    """
    opts = {str(k): str(v) for k, v in config.options.items()}
    kind = config.source_spec.kind
    if kind in BATCH_LIMITS:
        field_name, option, given = BATCH_LIMITS[kind]
        limit = getattr(config, field_name)
        if limit and not any(k.lower() == g.lower() for k in opts for g in given):
            opts[option] = str(limit)
    return opts


def _absolute(path: str) -> str:
    return absolute_path(path)


def _absolute_spec(spec: str, kinds: tuple[str, ...]) -> str:
    kind, sep, rest = spec.partition(":")
    if sep and kind.strip().lower() in kinds and rest.strip():
        return f"{kind}:{_absolute(rest.strip())}"
    return spec


def with_absolute_paths(config: JobConfig) -> JobConfig:
    """``config`` with relative local paths made absolute against this process's directory.

    Spark resolves a relative path against its JVM's working directory, which need not be
    this process's (a notebook that changed directory, a cluster); a job means the latter.

    >>> import os
    >>> cfg = with_absolute_paths(JobConfig("running-count", source="files:in", sink="json:out", checkpoint="ck"))
    >>> cfg.source == "files:" + os.path.abspath("in"), cfg.checkpoint == os.path.abspath("ck")
    (True, True)
    >>> with_absolute_paths(JobConfig("running-count", source="kafka:h:9092/t", sink="json:s3a://b/out")).sink
    'json:s3a://b/out'
    """
    changes: dict[str, Any] = {"source": _absolute_spec(config.source, ("files",)),
                               "sink": _absolute_spec(config.sink, ("parquet", "json"))}
    if config.deadletter:
        changes["deadletter"] = _absolute_spec(config.deadletter, ("parquet", "json"))
    for name in ("checkpoint", "metrics", "spark_log"):
        value = getattr(config, name)
        if value:
            changes[name] = _absolute(value)
    state = config.initial_state
    if state:
        changes["initial_state"] = _absolute_spec(state, ("json", "parquet")) if ":" in state else _absolute(state)
    return dataclasses.replace(config, **changes)


_FIELDS = {f.name: f for f in dataclasses.fields(JobConfig) if f.init}
_BOOLS = {"once", "emit_on_last"}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _key(name: str, where: str) -> str:
    key = str(name).strip().lower().replace("-", "_")
    if key not in _FIELDS:
        known = ", ".join(n.replace("_", "-") for n in _FIELDS)
        raise ConfigError(f"{where}: unknown setting {name!r}; known settings: {known}")
    return key


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{where}: expected true or false, got {value!r}")


def _options(value: Any, where: str) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    if isinstance(value, str):
        out = {}
        for item in filter(None, (p.strip() for p in value.split(","))):
            k, eq, v = item.partition("=")
            if not eq or not k.strip():
                raise ConfigError(f"{where}: options are KEY=VALUE pairs separated by commas, got {item!r}")
            out[k.strip()] = v.strip()
        return out
    if isinstance(value, (list, tuple)):
        return _options(",".join(map(str, value)), where)
    raise ConfigError(f"{where}: options must be a table of KEY = VALUE, got {type(value).__name__}")


def _normalize(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        key = _key(name, where)
        if value is None:
            continue
        if key in _BOOLS:
            out[key] = _bool(value, f"{where}: {key}")
        elif key == "options":
            out[key] = _options(value, f"{where}: options")
        elif isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: {key} must be a single value, got {type(value).__name__}")
        else:
            out[key] = str(value)
    return out


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The settings in a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file.

    TOML is read with the standard library's ``tomllib`` (Python 3.11+; ``tomli`` before);
    YAML needs PyYAML (``pip install 'sparkstate[config]'``).

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "job.toml")
    >>> _ = open(p, "w").write('pipeline = "sessionize"\\ngap = "2 minutes"\\n[options]\\nmaxFilesPerTrigger = 1\\n')
    >>> read_config_file(p)
    {'pipeline': 'sessionize', 'gap': '2 minutes', 'options': {'maxFilesPerTrigger': '1'}}
    """
    p = Path(path)
    where = f"config file {p}"
    suffix = p.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"{where}: expected a .yaml, .yml or .toml file")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    if suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise ConfigError(f"{where}: reading TOML on Python 3.10 needs tomli:"
                                  " pip install 'sparkstate[config]'") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"{where}: reading YAML needs PyYAML: pip install 'sparkstate[config]'") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML: {exc}") from None
        data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings (key: value), got {type(data).__name__}")
    return _normalize(data, where)


def read_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings in ``SPARKSTATE_*`` variables of ``env`` (others, e.g. ``SPARKSTATE_SPARK_LOG_LEVEL``, are not job settings).

    >>> read_env({"SPARKSTATE_SINK": "console", "SPARKSTATE_ONCE": "1", "SPARKSTATE_SPARK_LOG_LEVEL": "WARN"})
    {'sink': 'console', 'once': True}
    """
    raw = {}
    for name, value in env.items():
        if name.startswith(ENV_PREFIX):
            key = name[len(ENV_PREFIX):].lower()
            if key in _FIELDS:
                raw[key] = value
    return _normalize(raw, "environment")


def load_config(
    pipeline: str | None = None,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | os.PathLike | None = None,
) -> JobConfig:
    """Merge defaults < config file < environment < ``flags`` (and ``pipeline``) into a :class:`JobConfig`.

    ``flags`` hold what was given on the command line (``None`` values are "not given").
    ``env`` defaults to ``os.environ``; the config file is ``config_file``, else
    ``flags["config"]``, else ``SPARKSTATE_CONFIG``.

    >>> load_config(flags={"source": "files:in"}, env={"SPARKSTATE_PIPELINE": "running-count"}).pipeline
    'running-count'
    """
    env = os.environ if env is None else env
    flags = dict(flags or {})
    path = config_file or flags.pop("config", None) or env.get(ENV_PREFIX + "CONFIG") or None
    layers: list[tuple[str, dict[str, Any]]] = []
    if path:
        layers.append((f"config file {path}", read_config_file(path)))
    layers.append(("environment", read_env(env)))
    given = {k: v for k, v in flags.items() if v is not None}
    if pipeline is not None:
        given["pipeline"] = pipeline
    layers.append(("flags", _normalize(given, "flags")))
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, values in layers:
        merged.update(values)
        origin.update({k: where for k in values})
    if "pipeline" not in merged:
        raise ConfigError(f"run: name the pipeline ({', '.join(PIPELINE_NAMES)}): sparkstate run PIPELINE,"
                          " SPARKSTATE_PIPELINE or `pipeline` in the config file")
    if "source" not in merged:
        raise ConfigError("run: a source is required: --source SPEC (e.g. files:DIR), SPARKSTATE_SOURCE or"
                          " `source` in the config file")
    _drop_foreign_settings(merged, origin)
    return JobConfig(**merged)


def _drop_foreign_settings(merged: dict[str, Any], origin: Mapping[str, str]) -> None:
    """Drop (with a warning) the settings of other pipelines that this one does not read."""
    pipeline = JOB_PIPELINES.get(merged["pipeline"])
    if pipeline is None:
        return  # JobConfig names the known pipelines
    for key in list(merged):
        owners = _owners(key)
        if owners and key not in pipeline.settings and key not in REFUSED_ELSEWHERE:
            log.warning("run: %s (from the %s) applies to %s only; %s ignores it",
                        key.replace("_", "-"), origin[key], " and ".join(owners), pipeline.name)
            del merged[key]


__all__ = [
    "ENV_PREFIX",
    "JobConfig",
    "PIPELINE_NAMES",
    "REFUSED_ELSEWHERE",
    "load_config",
    "read_config_file",
    "read_env",
    "source_options",
    "with_absolute_paths",
]
