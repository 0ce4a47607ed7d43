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

import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import ConfigError
from ..paths import absolute_path
from .pipelines import JOB_PIPELINES, check_pack
from .settings import ENV_PREFIX, JOB_SETTINGS, PACED_TRIGGER, SCHEDULED_SOURCES, Setting, initial_state_path

if TYPE_CHECKING:
    from ..io.sinks import SinkSpec
    from ..io.sources import SourceSpec

log = logging.getLogger("sparkstate.jobs")

#: The pipelines' names (their declarations: :data:`~sparkstate.jobs.pipelines.JOB_PIPELINES`).
PIPELINE_NAMES: tuple[str, ...] = tuple(JOB_PIPELINES)


def default_trigger(config: "JobConfig") -> str:
    """The trigger of a job that gives none: :data:`~sparkstate.jobs.settings.PACED_TRIGGER` when its source is
    scheduled (:data:`~sparkstate.jobs.settings.SCHEDULED_SOURCES`: polling a directory on an object store back to back costs a listing
    every few milliseconds) or its pipeline has processing-time timers (Spark runs a batch at every
    trigger: back to back when idle); otherwise ``"0 seconds"``, a batch as soon as the previous one
    ends, so a record waits for no interval.

    >>> default_trigger(JobConfig("running-count", source="kafka:localhost:9092/words"))
    '0 seconds'
    >>> default_trigger(JobConfig("sessionize", source="kafka:localhost:9092/clicks", time_mode="processing"))
    '1 second'
    >>> default_trigger(JobConfig("running-count", source="files:/in"))
    '1 second'
    """
    timers = JOB_PIPELINES[config.pipeline].processing_timers
    if config.source_spec.kind in SCHEDULED_SOURCES or (timers is not None and timers(config)):
        return PACED_TRIGGER
    return "0 seconds"


def default_pack(config: "JobConfig") -> bool:
    """Whether a job that does not say (``--pack``/``--no-pack``) packs its input before the
    shuffle: yes when its source is scheduled (:data:`~sparkstate.jobs.settings.SCHEDULED_SOURCES`:
    large batches, where packing sustains more) or its pipeline packs streamed input
    (:attr:`~sparkstate.jobs.pipelines.JobPipeline.packs_streamed`); so not for sessionize
    reading ``kafka:`` or ``socket:``.

    >>> default_pack(JobConfig("sessionize", source="kafka:localhost:9092/clicks"))
    False
    >>> default_pack(JobConfig("sessionize", source="files:/in")), default_pack(
    ...     JobConfig("running-count", source="kafka:localhost:9092/words"))
    (True, True)
    """
    return config.source_spec.kind in SCHEDULED_SOURCES or JOB_PIPELINES[config.pipeline].packs_streamed


def all_settings() -> dict[str, Setting]:
    """Every setting by name: the job's (:data:`~sparkstate.jobs.settings.JOB_SETTINGS`), then each pipeline's."""
    out = {s.name: s for s in JOB_SETTINGS}
    for p in JOB_PIPELINES.values():
        for s in p.settings:
            out.setdefault(s.name, s)
    return out


def owners(name: str) -> list[str]:
    """The pipelines that declare setting ``name`` (empty: a setting of every job)."""
    return [p.name for p in JOB_PIPELINES.values() if any(s.name == name for s in p.settings)]


class JobConfig:
    """One streaming job: a pipeline between a source and a sink (see ``sparkstate run --help``).

    ``JobConfig(pipeline, source, **settings)`` takes the job's settings
    (:data:`~sparkstate.jobs.settings.JOB_SETTINGS`) and the pipeline's own
    (:attr:`~sparkstate.jobs.pipelines.JobPipeline.settings`, e.g. sessionize's ``gap``,
    ``time_mode``, ``watermark``, ``max_future_skew``, ``emit_on_last``), each checked by its
    declaration, then the pipeline's check of their combination: all before Spark starts. A
    setting left out takes its declared default; it reads as an attribute (``config.gap``).
    ``source``/``sink``/``deadletter`` are spec strings, parsed once into ``source_spec``,
    ``sink_spec`` and ``deadletter_spec`` (:func:`sparkstate.io.sources.parse_source`,
    :func:`sparkstate.io.sinks.parse_sink`); ``deadletter=None`` means the sink's default
    (``DIR/_deadletter`` beside a file sink). Relative local paths (of the specs, ``checkpoint``,
    ``metrics``, ``spark_log``, ``initial_state``) are made absolute against this process's
    directory: Spark resolves a relative path against its JVM's, which need not be the same.
    ``options`` go to the source's reader; ``max_batch_records`` / ``max_batch_files`` bound what
    a micro-batch reads (a limit given in ``options`` wins; a socket source cannot be limited).
    A config is frozen: :meth:`replace` makes a changed copy.

    >>> JobConfig("running-count", source="files:/in").sink
    'console'
    >>> JobConfig("sessions", source="files:in")
    Traceback (most recent call last):
    ...
    sparkstate.errors.ConfigError: run: unknown pipeline 'sessions'; choose one of sessionize, first-last-activity, running-count, visited-pages
    >>> JobConfig("running-count", source="files:/in", gap="1 minute")
    Traceback (most recent call last):
    ...
    sparkstate.errors.ConfigError: run: gap applies to sessionize only, not to running-count
    """

    source_spec: "SourceSpec"
    sink_spec: "SinkSpec"
    deadletter_spec: "SinkSpec | None"

    def __init__(self, pipeline: str, source: str | None = None, **settings: Any) -> None:
        if pipeline not in JOB_PIPELINES:
            raise ConfigError(f"run: unknown pipeline {pipeline!r}; choose one of {', '.join(JOB_PIPELINES)}")
        declared = {s.name: s for s in (*JOB_SETTINGS, *JOB_PIPELINES[pipeline].settings)}
        given = {k: v for k, v in settings.items() if v is not None}
        if source is None or (isinstance(source, str) and not source.strip()):
            raise ConfigError("run: a source is required: --source SPEC (e.g. files:DIR), SPARKSTATE_SOURCE or"
                              " `source` in the config file")
        given["source"] = source
        values: dict[str, Any] = {"pipeline": pipeline}
        for name in given:
            if name not in declared:
                where = owners(name)
                if where:
                    raise ConfigError(f"run: {name.replace('_', '-')} applies to {' and '.join(where)} only, not to {pipeline}")
                raise TypeError(f"JobConfig() got an unexpected setting {name!r}")
        for name, setting in declared.items():
            values[name] = setting.value(given[name], "run") if name in given else setting.default
        if values["options"] is None:
            values["options"] = {}
        if values["remote"] is not None and values["master"] is not None:
            raise ConfigError("run: give either master (Spark started here) or remote (a Spark Connect server), not both")
        from ..io.sinks import NEED_CHECKPOINT, parse_sink
        from ..io.sources import parse_source

        source_spec = _absolute(parse_source(values["source"]))
        sink_spec = _absolute(parse_sink(values["sink"]))
        dead_spec = None if values["deadletter"] is None else _absolute(parse_sink(values["deadletter"]))
        values["source"] = _spec_text(values["source"], source_spec)
        values["sink"] = _spec_text(values["sink"], sink_spec)
        if dead_spec is not None:
            values["deadletter"] = _spec_text(values["deadletter"], dead_spec)
        needs = [spec.kind for spec in (sink_spec, dead_spec) if spec is not None and spec.kind in NEED_CHECKPOINT]
        if needs and values["checkpoint"] is None:
            raise ConfigError(f"run: a {needs[0]} sink needs --checkpoint DIR (it is what makes the output"
                              " exactly-once across restarts)")
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_given", frozenset(given))
        object.__setattr__(self, "source_spec", source_spec)
        object.__setattr__(self, "sink_spec", sink_spec)
        object.__setattr__(self, "deadletter_spec", dead_spec)
        if values["trigger"] is None:  # decided from this config's source and pipeline settings, set above
            values["trigger"] = default_trigger(self)
        if values["pack"] is None:
            values["pack"] = default_pack(self)
        check_pack(self)
        check = JOB_PIPELINES[pipeline].check
        if check is not None:
            check(self)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        where = owners(name)
        if where:
            raise AttributeError(f"{name} is a setting of {' and '.join(where)}, not of {values.get('pipeline')}")
        raise AttributeError(f"JobConfig has no setting {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"JobConfig is frozen: use config.replace({name}=...)")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobConfig) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = {k: v for k, v in self._values.items() if k != "pipeline"}
        if self.sink_spec.kind == "postgres":
            shown["sink"] = str(self.sink_spec)  # the password stays out
        return f"JobConfig({self.pipeline!r}, {', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def given(self, name: str) -> bool:
        """Whether setting ``name`` was set (not left to its default)."""
        return name in self._given

    def replace(self, **changes: Any) -> "JobConfig":
        """A copy with ``changes`` (checked like the constructor's settings)."""
        values = {k: v for k, v in self._values.items() if k in self._given}
        values.update(changes)
        return JobConfig(self.pipeline, **values)

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain values (``options`` as a dict)."""
        d = dict(self._values)
        d["options"] = dict(d["options"])
        return d


def _absolute(spec: Any) -> Any:
    """A parsed source or sink spec with a relative local path made absolute."""
    if spec.kind in ("files", "parquet", "json") and spec.path:
        return replace(spec, path=absolute_path(spec.path))
    return spec


def _spec_text(text: str, spec: Any) -> str:
    """The spec string with its path made absolute (other specs as given: a postgres URL keeps its password)."""
    return str(spec) if spec.kind in ("files", "parquet", "json") and spec.path else text


def check_here(config: JobConfig, remote: str | None = None) -> None:
    """What ``config`` needs of this machine, checked without Spark: run it before starting Spark.

    A local ``files:`` source directory and a local initial state must exist; the packages a
    sink needs (``deltalake`` for ``delta:``, ``psycopg`` for ``postgres:``) and, with
    ``remote`` (a Spark Connect URL), the Connect client must be installed; records that may be
    refused need a dead-letter sink when the sink has no default one. Each refusal is a
    :class:`~sparkstate.errors.ConfigError` of one line saying the fix. ``sparkstate run`` calls
    it before it starts Spark.

    >>> check_here(JobConfig("running-count", source="files:/nonexistent"))
    Traceback (most recent call last):
    ...
    sparkstate.errors.ConfigError: run: the source directory /nonexistent does not exist; create it (files:DIR reads the files that land in DIR)
    """
    from ..extras import require
    from ..paths import local_path

    src = config.source_spec
    if src.kind == "files" and src.path:
        here = local_path(src.path)
        if here is not None and not here.is_dir():
            raise ConfigError(f"run: the source directory {src.path} does not exist; create it"
                              " (files:DIR reads the files that land in DIR)")
    if config.initial_state:
        path = initial_state_path(config.initial_state)[1]
        here = local_path(path)
        if here is not None and not here.exists():
            raise ConfigError(f"run: the initial state {path} does not exist (--initial-state takes what"
                              " `sparkstate state export` wrote, or JSON lines)")
    for spec in (config.sink_spec, config.deadletter_spec):
        if spec is not None and spec.kind in ("delta", "postgres"):
            require(spec.kind, f"run: the {spec.kind}: sink")
    if remote is not None:
        require("connect", f"run: --remote {remote}")
    sink = config.sink_spec
    if config.deadletter_spec is None and sink.deadletter_sink is None and sink.kind != "console":
        from ..io.sources import record_format

        here = local_path(src.path) if src.kind == "files" and src.path else None
        typed = src.kind == "files" and (here is None or record_format(src, config.format) == "parquet")
        if JOB_PIPELINES[config.pipeline].rejects or not typed:  # records may be refused: they need a place
            raise deadletters_needed(sink)


def deadletters_needed(sink: Any) -> ConfigError:
    """The error for a job whose sink has no default place for dead letters and that was given none."""
    return ConfigError(f"run: the sink {sink} has no default place for dead letters (malformed records are never"
                       " dropped silently); pass --deadletter SPEC, e.g. --deadletter json:DIR")


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


def _setting(name: str, where: str) -> Setting | None:
    """The declaration of setting ``name`` (``-`` and ``_`` alike); ``None`` for ``pipeline``."""
    key = str(name).strip().lower().replace("-", "_")
    if key == "pipeline":
        return None
    known = all_settings()
    if key not in known:
        raise ConfigError(f"{where}: unknown setting {name!r}; known settings:"
                          f" {', '.join(n.replace('_', '-') for n in ('pipeline', *known))}")
    return known[key]


def _normalize(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The settings of one layer (a file, the environment, the flags), each read by its declaration."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        setting = _setting(name, where)
        if value is None:
            continue
        if setting is None:
            out["pipeline"] = str(value)
        elif setting.kind in ("bool", "options"):
            out[setting.name] = setting.value(value, where)
        elif isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: {setting.name} must be a single value, got {type(value).__name__}")
        else:
            out[setting.name] = str(value)
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
    known = {s.env: s.name for s in all_settings().values()}
    known[ENV_PREFIX + "PIPELINE"] = "pipeline"
    return _normalize({known[k]: v for k, v in env.items() if k in known}, "environment")


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
    own = {s.name for s in pipeline.settings}
    for key in list(merged):
        where = owners(key)
        if where and key not in own:
            log.warning("run: %s (from the %s) applies to %s only; %s ignores it",
                        key.replace("_", "-"), origin[key], " and ".join(where), pipeline.name)
            del merged[key]


__all__ = [
    "ENV_PREFIX",
    "JobConfig",
    "PIPELINE_NAMES",
    "all_settings",
    "check_here",
    "deadletters_needed",
    "default_trigger",
    "load_config",
    "owners",
    "read_config_file",
    "read_env",
    "source_options",
]
