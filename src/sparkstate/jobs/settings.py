"""A job's settings, each declared once as a :class:`Setting`.

A declaration gives a setting's name, kind (which fixes its type and check), default and help
text; from the name come its flag (``--time-mode``), its environment variable
(``SPARKSTATE_TIME_MODE``) and its config-file key (``time_mode`` or ``time-mode``). The job-wide
settings are :data:`JOB_SETTINGS`; each pipeline declares its own beside it
(:attr:`sparkstate.jobs.pipelines.JobPipeline.settings`). The config loader
(:mod:`sparkstate.jobs.config`), ``sparkstate run`` and its ``--help`` read these declarations.

>>> s = Setting("time_mode", "which clock ends a session", "event", kind="choice", choices=("event", "processing"))
>>> s.flag, s.env, s.value("processing", "flags")
('--time-mode', 'SPARKSTATE_TIME_MODE', 'processing')
>>> s.value("wall", "flags")
Traceback (most recent call last):
...
sparkstate.errors.ConfigError: run: time-mode must be one of event, processing, got 'wall'
>>> Setting("gap", "inactivity that ends a session", "1 minute", kind="duration").value("0 seconds", "flags")
Traceback (most recent call last):
...
sparkstate.errors.ConfigError: run: gap: expected a positive duration, got '0 seconds' (0 ms)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Protocol

from ..durations import positive_ms, to_ms
from ..errors import ConfigError
from ..paths import absolute_path

#: Environment variables of job settings begin with this.
ENV_PREFIX = "SPARKSTATE_"

#: ``text``: a string; ``path``: a local path (made absolute) or a URI; ``bool``; ``count``: a whole
#: number >= 0; ``duration``: a positive duration; ``delay``: a duration >= 0 (``lateness``, its
#: earlier name, is the same kind); ``choice``: one of ``choices``; ``options``: KEY=VALUE pairs.
Kind = Literal["text", "path", "bool", "count", "duration", "delay", "lateness", "choice", "options"]

#: Sources read on a schedule (a directory listed, a generator's clock): a job of theirs starts a
#: batch at most once per :data:`PACED_TRIGGER` unless its trigger is given. Kafka and socket
#: records start one as soon as the previous batch ends (Spark's own default). The rule:
#: :func:`sparkstate.jobs.config.default_trigger`.
SCHEDULED_SOURCES = ("files", "generator")
#: The trigger of a job on a scheduled source, or with processing-time timers, that gives none.
PACED_TRIGGER = "1 second"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class SettingValues(Protocol):
    """A job's settings read as attributes (``cfg.gap``), which is what a
    :class:`~sparkstate.jobs.config.JobConfig` is: a pipeline's builder and check read them
    through this, so the pipelines' declarations need not know the config's class."""

    def __getattr__(self, name: str) -> Any: ...


@dataclass(frozen=True)
class Setting:
    """One job setting: ``name`` (snake_case), its ``help`` text, ``default`` and ``kind``.

    ``help`` says what the setting does; unless it states its default itself ("default: ..."),
    the default is appended to it. ``metavar`` names the value in ``--help``. ``check(value)``
    refuses (:class:`~sparkstate.errors.ConfigError`) a value beyond what the kind checks,
    before Spark starts; it may return the value in its normal form.
    """

    name: str
    help: str
    default: Any = None
    kind: Kind = "text"
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    check: Callable[[Any], Any] | None = None

    @property
    def flag(self) -> str:
        """The command-line flag: ``--time-mode`` (``--option``, repeated, for ``options``)."""
        return "--option" if self.kind == "options" else "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        """The environment variable: ``SPARKSTATE_TIME_MODE``."""
        return ENV_PREFIX + self.name.upper()

    @property
    def label(self) -> str:
        """The name in messages: ``time-mode``."""
        return self.name.replace("_", "-")

    def help_text(self, owners: str = "") -> str:
        """The ``--help`` line: ``owners`` (the pipelines that read it), the help, the default."""
        text = f"{owners}: {self.help}" if owners else self.help
        if "default:" in self.help or self.default is None or self.default is False:
            return text
        shown = f"{self.default:,}" if isinstance(self.default, int) and not isinstance(self.default, bool) else self.default
        return f"{text} (default: {shown})"

    def value(self, raw: Any, where: str) -> Any:
        """``raw`` (from a flag, a variable, a file or Python) as this setting's value, checked.

        >>> Setting("once", "stop when caught up", False, kind="bool").value("yes", "environment")
        True
        >>> Setting("max_batch_files", "files per batch", 100, kind="count").value("1_000", "flags")
        1000
        """
        what = f"run: {self.label}"
        if self.kind == "bool":
            value: Any = _bool(raw, f"{where}: {self.name}")
        elif self.kind == "options":
            value = _options(raw, f"{where}: options")
        elif isinstance(raw, (dict, list, tuple, set)):
            raise ConfigError(f"{where}: {self.name} must be a single value, got {type(raw).__name__}")
        elif self.kind == "count":
            value = _count(raw, what)
        elif self.kind in ("duration", "delay", "lateness"):
            try:
                ms = positive_ms(raw, f"run: {self.name}") if self.kind == "duration" else to_ms(raw, f"run: {self.name}")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if ms < 0:
                raise ConfigError(f"run: {self.name} must be zero or positive, got {raw!r}")
            value = raw if not isinstance(raw, str) else raw.strip()
        else:
            value = str(raw).strip() if not isinstance(raw, str) else raw
            if self.kind == "choice" and value not in self.choices:
                raise ConfigError(f"{what} must be one of {', '.join(self.choices)}, got {raw!r}")
            if self.kind == "path":
                value = absolute_path(value)
        if self.check is not None:
            checked = self.check(value)
            value = value if checked is None else checked
        return value


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{where}: expected true or false, got {value!r}")


def _count(value: Any, what: str) -> int:
    try:
        number = int(str(value).strip().replace("_", "")) if not isinstance(value, bool) else -1
    except ValueError:
        number = -1
    if number < 0:
        raise ConfigError(f"{what} is a whole number >= 0 (0: no limit), got {value!r}")
    return number


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


def _master(value: str) -> None:
    if not value.strip() or any(c.isspace() for c in value.strip()):
        raise ConfigError(f"run: master must be a Spark master URL such as spark://HOST:7077 or local[2], got {value!r}")


def _remote(value: str) -> None:
    if not value.strip().startswith("sc://"):
        raise ConfigError(f"run: remote must be a Spark Connect URL such as sc://HOST:15002, got {value!r}")


def _engine(value: str) -> None:
    from ..engines import ENGINES  # the registry may grow at run time (register_engine)

    if value not in ENGINES:
        raise ConfigError(f"run: engine must be one of {', '.join(sorted(ENGINES))}, got {value!r}")


def _source(value: str) -> None:
    from ..io.sources import parse_source

    if not value.strip():
        raise ConfigError("run: a source is required: --source SPEC (e.g. files:DIR), SPARKSTATE_SOURCE or"
                          " `source` in the config file")
    parse_source(value)


def _sink(value: str) -> None:
    from ..io.sinks import parse_sink

    parse_sink(value)


def _job_settings() -> tuple[Setting, ...]:
    from ..io.sinks import ACCEPTED_FORMS
    from ..io.sources import ACCEPTED, FORMATS

    return (
        Setting("source", " | ".join(ACCEPTED), metavar="SPEC", check=_source),
        Setting("format", "record format (default: json, or what a files: directory holds)", kind="choice",
                choices=FORMATS),
        Setting("sink", ACCEPTED_FORMS, "console", metavar="SPEC", check=_sink),
        Setting("checkpoint", "checkpoint directory (needed by file, postgres, delta and kafka sinks)", kind="path",
                metavar="DIR"),
        Setting("deadletter", "sink for malformed records, a SPEC like --sink's (default: DIR/_deadletter beside a"
                              " file or delta sink, console for console)", metavar="SPEC", check=_sink),
        Setting("trigger", "micro-batch interval; 0: a batch as soon as the previous one ends (default: "
                           f"{PACED_TRIGGER} for {' and '.join(k + ':' for k in SCHEDULED_SOURCES)} sources and for"
                           " processing-time sessionize, whose timers make Spark run a batch at every trigger; 0 for"
                           " the others)", kind="delay", metavar="DURATION"),
        Setting("initial_state", "the state a new checkpoint starts from: Parquet (as `sparkstate state export`"
                                 " writes it) or JSON lines of the key and state fields (visited-pages: user_id,"
                                 " visited_pages; json:PATH / parquet:PATH to say which)", metavar="PATH",
                check=_initial_state),
        Setting("metrics", "append one JSON line per micro-batch to FILE", kind="path", metavar="FILE"),
        Setting("once", "process what is available (and the timeouts it makes due), then stop", False, kind="bool"),
        Setting("query_name", "name of the streaming query (default: sparkstate_PIPELINE)", metavar="NAME"),
        Setting("options", "an option for the source's reader, e.g. maxFilesPerTrigger=1 (repeatable)",
                kind="options", metavar="KEY=VALUE"),
        Setting("spark_log", "where Spark's own output goes when sparkstate starts Spark (default: CHECKPOINT/spark.log;"
                             " without a local checkpoint, a file in the temp directory, removed when the run"
                             " succeeds)", kind="path", metavar="FILE"),
        Setting("master", "Spark master when sparkstate starts Spark, e.g. spark://HOST:7077 (default: local[*])",
                metavar="URL", check=_master),
        Setting("remote", "run on a Spark Connect server, e.g. sc://HOST:15002 (default: SPARK_REMOTE; needs"
                          " pip install 'sparkstate[connect]')", metavar="URL", check=_remote),
        Setting("engine", "state engine: batched or tws (default: the one that wrote the checkpoint, else batched,"
                          " the fastest)", metavar="NAME", check=_engine),
        Setting("pack", "batched engine: cut each micro-batch's input into Arrow blobs by bucket before the shuffle"
                        " (more records a second in large batches); --no-pack makes a small batch faster: less"
                        " latency at low rates (default: on, except sessionize reading kafka: or socket:;"
                        " docs/performance.md, Settings for low latency)", kind="bool"),
        Setting("packages", "Maven coordinates Spark resolves at start (spark.jars.packages), e.g. Spark's Kafka"
                            " connector for kafka: sources and sinks", metavar="COORDS"),
        Setting("jars", "local jar files for Spark's classpath (spark.jars), comma-separated (default for kafka:"
                        " specs: the jars `python -m sparkstate.io.connectors fetch` (make kafka) fetched, if any)",
                metavar="PATHS"),
        Setting("max_batch_records", "the most records a micro-batch reads from a generator or Kafka source, so a"
                                     " backlog is worked off in bounded batches (0: no limit)", 100_000, kind="count",
                metavar="N"),
        Setting("max_batch_files", "the most files a micro-batch reads from a files source (0: no limit)", 100,
                kind="count", metavar="N"),
    )


def initial_state_path(text: str) -> tuple[str | None, str]:
    """An ``--initial-state`` value as (format, path): ``json:PATH`` / ``parquet:PATH`` say the
    format; otherwise it is ``None`` (decided by what the path holds).

    >>> initial_state_path("json:s3a://b/start"), initial_state_path("/data/start.parquet")
    (('json', 's3a://b/start'), (None, '/data/start.parquet'))
    """
    fmt, sep, rest = text.partition(":")
    return (fmt, rest) if sep and fmt in ("json", "parquet") else (None, text)


def _initial_state(value: str) -> str:
    fmt, path = initial_state_path(value)
    return absolute_path(path) if fmt is None else f"{fmt}:{absolute_path(path)}"


#: The settings of every job (a pipeline's own: :attr:`~sparkstate.jobs.pipelines.JobPipeline.settings`).
JOB_SETTINGS: tuple[Setting, ...] = _job_settings()

__all__ = ["ENV_PREFIX", "JOB_SETTINGS", "Kind", "PACED_TRIGGER", "SCHEDULED_SOURCES", "Setting", "initial_state_path"]
