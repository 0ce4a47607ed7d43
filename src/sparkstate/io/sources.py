"""Where records come from: ``generator``, ``socket:HOST:PORT``, ``files:DIR``, ``kafka:BROKERS/TOPIC``.

:func:`parse_source` turns a spec string into a :class:`SourceSpec`; :func:`open_source` turns
that into a :class:`Source`: two streaming DataFrames, the good records typed by the schema
(``events``) and the bad ones with their reason (``dead_letters``, see :mod:`sparkstate.io.parse`).
Every record of the source lands in exactly one of them.

>>> spec = parse_source("socket:9999")
>>> spec.kind, spec.host, spec.port, str(spec)
('socket', '127.0.0.1', 9999, 'socket:127.0.0.1:9999')
>>> parse_source("kafka:b1:9092,b2:9092/clicks").topic
'clicks'
>>> parse_source("kafka:b1:9092/a,b").topics
('a', 'b')
>>> parse_source("generator:rate=500,users=100,seed=7").generator.users
100
>>> parse_source("ftp://x")
Traceback (most recent call last):
...
sparkstate.errors.ConfigError: source 'ftp://x': expected one of generator[:rate=500,users=100,seed=7,late=0.01,malformed=0.01], socket:[HOST:]PORT, files:DIR, kafka:BROKERS/TOPIC[,TOPIC...]

``events`` and ``dead_letters`` are two views of one source: each streaming query on them reads
the source itself. That is exact for files, Kafka and the generator (they replay by offset);
a socket source opens one connection per query, so its server must send every line to every
connection (as :func:`sparkstate.synthetic.stream.serve_events` does).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Literal, Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from .. import fs
from ..errors import ConfigError
from . import connectors
from ..synthetic.generator import EVENT_SCHEMA
from ..synthetic.stream import StreamConfig
from .parse import (
    DEFAULT_MAX_RECORD_BYTES,
    Parsed,
    check_csv_tokens,
    csv_read_options,
    csv_string_schema,
    parse_csv,
    parse_json,
    to_struct,
    valid_utf8,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkstate.io")

SourceKind = Literal["generator", "socket", "files", "kafka"]
Format = Literal["json", "csv", "parquet"]
FORMATS: tuple[str, ...] = ("json", "csv", "parquet")
#: The accepted spec forms, for messages and help texts.
ACCEPTED = (
    "generator[:rate=500,users=100,seed=7,late=0.01,malformed=0.01]",
    "socket:[HOST:]PORT",
    "files:DIR",
    "kafka:BROKERS/TOPIC[,TOPIC...]",
)
#: Socket sources connect here unless the spec names a host.
DEFAULT_SOCKET_HOST = "127.0.0.1"
#: The class Spark's Kafka connector provides; checked before a Kafka stream is defined.
KAFKA_PROVIDER = connectors.KAFKA_PROVIDER


@dataclass(frozen=True)
class SourceSpec:
    """A parsed source spec (see :func:`parse_source`); ``str(spec)`` is its canonical form."""

    kind: SourceKind
    text: str
    path: str | None = None
    host: str | None = None
    port: int | None = None
    brokers: str | None = None
    topic: str | None = None
    generator: StreamConfig | None = field(default=None, repr=False)

    @property
    def topics(self) -> tuple[str, ...]:
        """The Kafka topics of a ``kafka:`` spec (``topic`` holds them comma-separated)."""
        return tuple(t for t in (self.topic or "").split(",") if t)

    def __str__(self) -> str:
        if self.kind == "files":
            return f"files:{self.path}"
        if self.kind == "socket":
            host = f"[{self.host}]" if ":" in (self.host or "") else self.host
            return f"socket:{host}:{self.port}"
        if self.kind == "kafka":
            return f"kafka:{self.brokers}/{self.topic}"
        return self.text.strip() or "generator"


@dataclass(frozen=True)
class Source:
    """An opened source: typed good records, dead letters, and what they were read as.

    ``events`` has exactly the schema's columns; ``dead_letters`` has ``raw, raw_bytes, reason, source,
    received_at`` and is ``None`` for Parquet (typed already: its rows pass unchanged).
    ``checked`` is the frame both are filtered from (see :class:`sparkstate.io.parse.Parsed`);
    ``max_record_bytes`` the size over which a record was not parsed.
    """

    spec: SourceSpec
    fmt: Format
    schema: StructType
    events: DataFrame
    dead_letters: DataFrame | None
    checked: DataFrame | None = None
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES


def _fail(text: str, why: str = "") -> ConfigError:
    hint = f" ({why})" if why else ""
    return ConfigError(f"source {text!r}: expected one of {', '.join(ACCEPTED)}{hint}")


def _port(text: str, value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise ConfigError(f"source {text!r}: the port must be a number from 1 to 65535, got {value!r}")
    return int(value)


def parse_source(text: str) -> SourceSpec:
    """Parse a source spec; a bad one raises :class:`~sparkstate.errors.ConfigError` naming the accepted forms.

    - ``generator`` or ``generator:key=value,...`` (keys of
      :class:`~sparkstate.synthetic.stream.StreamConfig`: ``rate``, ``users``, ``seed``, ``events``,
      ``gap``, ``last``, ``late``, ``late_by``, ``malformed``, ``session``, ...)
    - ``socket:PORT`` (on localhost) or ``socket:HOST:PORT``
    - ``files:DIR``: a landing directory of JSON-lines, CSV or Parquet files
    - ``kafka:BROKERS/TOPIC[,TOPIC...]``: ``BROKERS`` is ``host:port[,host:port...]``; several
      topics are read as one stream

    >>> parse_source("files:/data/in").path
    '/data/in'
    >>> parse_source("socket:example.org:7000").host
    'example.org'
    """
    if not isinstance(text, str):
        raise ConfigError(f"source: expected a spec string such as 'files:/data/in', got {type(text).__name__}")
    spec = text.strip()
    kind, sep, rest = spec.partition(":")
    kind = kind.lower()
    if kind == "generator":
        params: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))) if sep else ():
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ConfigError(
                    f"source {text!r}: generator options are key=value pairs separated by commas"
                    f" (e.g. generator:rate=500,users=100,seed=7), got {item!r}"
                )
            params[key.strip()] = value.strip()
        return SourceSpec("generator", spec, generator=StreamConfig.from_options(params))
    if not sep or not rest.strip():
        if kind in ("socket", "files", "kafka"):
            raise _fail(text, f"{kind}: needs what follows the colon")
        raise _fail(text)
    rest = rest.strip()
    if kind == "socket":
        if rest.isdigit():
            return SourceSpec("socket", spec, host=DEFAULT_SOCKET_HOST, port=_port(text, rest))
        host, colon, port = rest.rpartition(":")
        host = host.strip("[]")
        if not colon or not host:
            raise _fail(text, "socket: give PORT or HOST:PORT")
        return SourceSpec("socket", spec, host=host, port=_port(text, port))
    if kind == "files":
        path = str(Path(rest).expanduser()) if rest.startswith("~") else rest
        return SourceSpec("files", spec, path=path)
    if kind == "kafka":
        brokers, slash, topic = rest.rpartition("/")
        if not slash or not brokers or not topic:
            raise _fail(text, "kafka: give BROKERS/TOPIC, e.g. kafka:localhost:9092/clicks")
        bad = [b for b in brokers.split(",") if not b.rpartition(":")[0] or not b.rpartition(":")[2].isdigit()]
        if bad:
            raise ConfigError(f"source {text!r}: Kafka brokers are host:port[,host:port...], got {', '.join(bad)}")
        topics = [t.strip() for t in topic.split(",")]
        bad_topics = [t for t in topics if not t or not all(c.isalnum() or c in "._-" for c in t)]
        if bad_topics:
            raise ConfigError(f"source {text!r}: Kafka topic names are letters, digits, '.', '_' and '-',"
                              f" separated by commas; got {topic!r}")
        return SourceSpec("kafka", spec, brokers=brokers, topic=",".join(topics))
    if kind in ("file", "dir", "path"):
        raise _fail(text, f"did you mean files:{rest}?")
    raise _fail(text)


def _guess_format(path: str) -> Format:
    """JSON unless the directory holds only ``.csv`` or only ``.parquet`` files (on any filesystem Spark reaches)."""
    from .. import fs

    try:
        names = fs.list_names(path)
    except fs.FsUnavailable as exc:
        log.warning("files:%s: its files were not looked at (%s); reading it as JSON (--format says otherwise)", path, exc)
        return "json"
    suffixes = {Path(n).suffix.lower() for n in names if not n.startswith((".", "_"))}
    if suffixes == {".csv"}:
        return "csv"
    if suffixes == {".parquet"}:
        return "parquet"
    return "json"


def record_format(spec: SourceSpec, fmt: str | None) -> Format:
    """The format records of ``spec`` are read in: ``fmt`` checked, or for a ``files:`` directory
    without one, what its files are (:func:`_guess_format`); needs no Spark for a local directory."""
    if fmt is None:
        return _guess_format(spec.path or "") if spec.kind == "files" else "json"
    low = str(fmt).lower()
    if low not in FORMATS:
        raise ConfigError(f"source {spec}: format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if low == "parquet" and spec.kind != "files":
        raise ConfigError(f"source {spec}: parquet is read from files:DIR only; {spec.kind} sources carry text (json or csv)")
    if low == "csv" and spec.kind == "generator":
        raise ConfigError(f"source {spec}: the generator writes JSON lines; use format json (or leave it unset)")
    return low  # type: ignore[return-value]


def _parse_lines(raw: DataFrame, fmt: Format, struct: StructType, source: Column, **kw: object) -> Parsed:
    if fmt == "csv":
        return parse_csv(raw, struct, source=source, **kw)  # type: ignore[arg-type]
    return parse_json(raw, struct, source=source, **kw)  # type: ignore[arg-type]


def _open_files(spark: "SparkSession", spec: SourceSpec, fmt: Format, struct: StructType,
                opts: dict[str, str], kw: dict) -> tuple[DataFrame, DataFrame | None, DataFrame | None]:
    path = spec.path or ""
    try:
        if fmt == "parquet":
            df = spark.readStream.schema(struct).options(**opts).parquet(path)
            # A Parquet string may hold bytes that are not UTF-8 (another writer wrote them): made valid
            # text (each invalid sequence U+FFFD), so no output sink writes an unreadable file.
            cols = [valid_utf8(F.col(f"`{f.name}`")).alias(f.name) if isinstance(f.dataType, StringType)
                    else F.col(f"`{f.name}`") for f in struct.fields]
            return df.select(*cols), None, None
        if fmt == "csv":
            csv_opts = {"header": "true", **csv_read_options(opts)}
            tokens = spark.readStream.schema(csv_string_schema(struct)).options(**csv_opts).csv(path)
            parsed = check_csv_tokens(tokens, struct, source=F.col("_metadata.file_path"), options=opts, **kw)
        else:
            lines = spark.readStream.options(**opts).text(path)
            parsed = parse_json(lines, struct, source=F.col("_metadata.file_path"), options=opts, **kw)
    except Exception as exc:
        if fs.is_path_not_found(exc):
            raise ConfigError(
                f"source {spec}: the directory {path} does not exist. Create it (the stream reads the"
                f" files that land in it) or fix the path in files:DIR"
            ) from None
        raise
    return parsed.events, parsed.dead_letters, parsed.checked


def kafka_connector_available(spark: "SparkSession") -> bool | None:
    """Whether Spark's Kafka connector is on the driver's classpath (``None``: cannot tell, e.g. Spark Connect).

    >>> import sparkstate as ss
    >>> kafka_connector_available(ss.spark_session()) in (True, False)
    True
    """
    return connectors.kafka_connector_available(spark)


def kafka_package(spark: "SparkSession | None" = None) -> str:
    """The Maven coordinates of the Kafka connector for ``spark``'s version (decided in :mod:`sparkstate.io.connectors`).

    >>> kafka_package()
    'org.apache.spark:spark-sql-kafka-0-10_2.13:...'
    """
    return connectors.kafka_coordinates(None if spark is None else spark.version)


def _kafka_missing(spark: "SparkSession", spec: SourceSpec) -> ConfigError:
    return connectors.kafka_missing(spark.version, f"source {spec}")


#: The Kafka source's own options (the rest go to the JSON/CSV parser; ``kafka.*`` to the consumer).
KAFKA_OPTIONS = ("startingOffsets", "endingOffsets", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
                 "failOnDataLoss", "startingTimestamp", "startingOffsetsByTimestamp", "maxTriggerDelay",
                 "minPartitions", "groupIdPrefix", "includeHeaders", "kafkaConsumer.pollTimeoutMs",
                 "fetchOffset.numRetries", "fetchOffset.retryIntervalMs")


#: Consumer settings the Kafka source gets unless the options give their own. ``fetch.max.wait.ms``:
#: how long the broker may hold a fetch that has less than ``fetch.min.bytes`` (Kafka's default
#: 500 ms). A micro-batch's read of a short offset range waited it out: on the latency benchmark's
#: local broker, the first stage of a one-record batch took 510-533 ms with Kafka's default and
#: 31-56 ms with 20 ms, for every contender, Java's included (docs/performance.md, Latency). A
#: fetch that finds data returns at once either way, so only a read that reaches the end of the
#: partition's records waits, now 20 ms.
KAFKA_CONSUMER_DEFAULTS = {"kafka.fetch.max.wait.ms": "20"}


def _kafka_reader_options(opts: dict[str, str]) -> dict[str, str]:
    own = {o.lower() for o in KAFKA_OPTIONS}
    return {k: v for k, v in opts.items() if k.lower() in own or k.startswith("kafka.")}


def kafka_records(spark: "SparkSession", spec: SourceSpec | str, options: Mapping[str, object] | None = None) -> DataFrame:
    """The Kafka topics of ``spec`` as a stream of their records, unparsed.

    Columns: ``key`` and ``value`` (strings), ``topic``, ``partition``, ``offset``,
    ``timestamp`` (the record's Kafka timestamp) and ``_where`` (``kafka:TOPIC/PARTITION@OFFSET``,
    what dead letters carry as their ``source``). ``options`` go to Spark's Kafka source
    (:data:`KAFKA_OPTIONS`, ``kafka.*`` consumer settings; it ignores others), over
    :data:`KAFKA_CONSUMER_DEFAULTS`.
    """
    if isinstance(spec, str):
        spec = parse_source(spec)
    if spec.kind != "kafka":
        raise ConfigError(f"kafka_records: expected a kafka: source, got {spec}")
    if kafka_connector_available(spark) is False:
        raise _kafka_missing(spark, spec)
    opts = {str(k): str(v) for k, v in (options or {}).items()}
    given = {k.lower() for k in opts}
    opts = {**{k: v for k, v in KAFKA_CONSUMER_DEFAULTS.items() if k.lower() not in given}, **opts}
    try:
        df = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", spec.brokers)
            .option("subscribe", spec.topic)
            .options(**opts)
            .load()
        )
    except Exception as exc:
        if "KAFKA_DATA_SOURCE_NOT_ENABLED" in str(exc) or "Failed to find data source: kafka" in str(exc):
            raise _kafka_missing(spark, spec) from None
        raise
    where = F.concat(F.lit("kafka:"), F.col("topic"), F.lit("/"), F.col("partition").cast("string"),
                     F.lit("@"), F.col("offset").cast("string"))
    return df.select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"),
                     "topic", "partition", "offset", "timestamp", where.alias("_where"))


def _open_kafka(spark: "SparkSession", spec: SourceSpec, opts: dict[str, str]) -> DataFrame:
    return kafka_records(spark, spec, opts).select("value", "_where")


def open_source(
    spark: "SparkSession",
    spec: SourceSpec | str,
    schema: str | StructType = EVENT_SCHEMA,
    fmt: str | None = None,
    options: Mapping[str, object] | None = None,
    *,
    required: Iterable[str] | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Source:
    """Define the streaming read of ``spec`` and split it into good records and dead letters.

    ``schema``: the records' columns (DDL or ``StructType``; default the clickstream's).
    ``fmt``: ``"json"`` (JSON lines), ``"csv"`` (files: with a header line, columns by
    position) or ``"parquet"`` (files only); ``None``: JSON, or for a local ``files:`` directory
    holding only ``.csv`` / ``.parquet`` files, that. ``options`` go to Spark's reader and parser
    (``maxFilesPerTrigger``, ``timestampFormat``, ``startingOffsets``, the generator's
    ``maxEventsPerTrigger`` and :class:`~sparkstate.synthetic.stream.StreamConfig` keys, ...).
    ``required``: fields a record must carry (default: the schema's ``NOT NULL`` fields, or all).

    Errors in the definition are :class:`~sparkstate.errors.ConfigError` s: a missing
    directory, a Kafka connector that is not on the classpath, a bad spec or format. A socket
    source connects when the query starts.

    >>> import sparkstate as ss, tempfile
    >>> src = open_source(ss.spark_session(), "files:" + tempfile.mkdtemp(), fmt="json",
    ...                   options={"maxFilesPerTrigger": 1})
    >>> src.events.columns, src.dead_letters.columns
    (['user_id', 'event_time', 'data', 'is_last'], ['raw', 'raw_bytes', 'reason', 'source', 'received_at'])
    """
    if isinstance(spec, str):
        spec = parse_source(spec)
    if not isinstance(spec, SourceSpec):
        raise ConfigError(f"open_source: expected a SourceSpec or a spec string, got {type(spec).__name__}")
    form = record_format(spec, fmt)
    struct = to_struct(schema)
    opts = {str(k): str(v) for k, v in (options or {}).items()}
    kw = {"required": required, "max_record_bytes": max_record_bytes}

    if spec.kind == "files":
        events, dead, checked = _open_files(spark, spec, form, struct, opts, kw)
        return Source(spec, form, struct, events, dead, checked, max_record_bytes)

    if spec.kind == "generator":
        from ..synthetic.generator_source import SOURCE_OPTIONS as GENERATOR_SOURCE_OPTIONS, register

        name = register(spark)
        config_keys = {k.lower() for k in StreamConfig.keys()}
        config = StreamConfig.from_options(
            {k: v for k, v in opts.items() if k.lower() in config_keys}, base=spec.generator
        )
        own = {k: v for k, v in opts.items() if k.lower() not in config_keys}
        unknown = sorted(k for k in own if k.lower() not in {o.lower() for o in GENERATOR_SOURCE_OPTIONS})
        if unknown:
            raise ConfigError(
                f"source {spec}: unknown generator option(s) {', '.join(unknown)}; accepted:"
                f" {', '.join(list(GENERATOR_SOURCE_OPTIONS) + StreamConfig.keys())}"
            )
        df = spark.readStream.format(name).options(**config.to_options()).options(**own).load()
        raw = df.select("value", F.concat(F.lit("generator@"), F.col("offset").cast("string")).alias("_where"))
        spec = SourceSpec("generator", spec.text, generator=config)
    elif spec.kind == "socket":
        df = spark.readStream.format("socket").option("host", spec.host).option("port", spec.port).options(**opts).load()
        raw = df.select("value", F.lit(str(spec)).alias("_where"))
    else:
        raw = _open_kafka(spark, spec, opts)
    parse_opts = {k: v for k, v in opts.items() if spec.kind != "generator"}
    if spec.kind == "kafka":  # the source's own options are not the parser's
        parse_opts = {k: v for k, v in parse_opts.items() if k not in _kafka_reader_options(parse_opts)}
    parsed = _parse_lines(raw, form, struct, F.col("_where"), options=parse_opts, **kw)
    return Source(spec, form, struct, parsed.events, parsed.dead_letters, parsed.checked, max_record_bytes)


__all__ = [
    "ACCEPTED",
    "DEFAULT_SOCKET_HOST",
    "FORMATS",
    "Format",
    "KAFKA_PROVIDER",
    "KAFKA_CONSUMER_DEFAULTS",
    "Source",
    "SourceKind",
    "SourceSpec",
    "kafka_connector_available",
    "kafka_package",
    "kafka_records",
    "open_source",
    "parse_source",
    "record_format",
]
