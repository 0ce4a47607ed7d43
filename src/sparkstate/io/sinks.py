"""Where a stream's rows go: ``console``, ``parquet:DIR``, ``json:DIR``, ``postgres:URL/TABLE``, ``delta:PATH``, ``kafka:BROKERS/TOPIC``, ``memory``.

A sink is named by a short spec string (:func:`parse_sink` -> :class:`SinkSpec`) and started on
a streaming DataFrame with :func:`start_sink`, which returns the ``StreamingQuery``.

Every sink is written through ``foreachBatch`` by the writer of its kind
(:func:`sparkstate.io.writers.batch_writer`), the same the jobs write their output and dead
letters with, so a sink's layout and bookkeeping exist once.

- ``console``: prints each micro-batch for humans (up to 100 rows, values not truncated).
- ``memory`` / ``memory:NAME``: an in-memory table for tests, ``spark.table(NAME)`` (a temporary
  view over every row written so far); without a name, the query name or ``sparkstate_output``.
  It is not kept across restarts: a checkpoint holding an earlier run is refused.
- ``parquet:DIR`` / ``json:DIR``: in ``append`` output mode, files plus a ``DIR/_spark_metadata``
  log of committed batches (Spark's file-sink log, which Spark's readers follow and which makes
  a replayed batch a no-op). In ``update`` output mode (which Spark's file sink refuses) each
  micro-batch goes to ``DIR/batch_id=N``, committed by its ``_SUCCESS``; reading ``DIR`` then
  yields an extra ``batch_id`` column (partition discovery). Either way every file is written
  under ``DIR/_sparkstate_tmp`` first and renamed into place, and files of an attempt that did not
  commit are deleted before the batch is written again, so pandas, pyarrow and DuckDB
  (``DIR/*.parquet``) read the same rows as Spark (:mod:`sparkstate.io.files`). Not so for
  :func:`start_sink` over Spark Connect in append mode, which is Spark's own file sink.
- ``postgres:postgresql://USER@HOST:PORT/DB/TABLE``: one transaction per micro-batch holding
  the rows and the batch id; a replayed batch is skipped (see :mod:`sparkstate.io.postgres`).
  Each batch's rows are appended, in update mode too.
- ``delta:PATH``: a Delta Lake table; one Delta commit per micro-batch holding the rows and
  the batch id as the table's application transaction; a replayed batch is skipped (see
  :mod:`sparkstate.io.delta`; needs ``pip install 'sparkstate[delta]'``).
- ``kafka:BROKERS/TOPIC``: one JSON message per row, keyed by the key column, through Spark's
  Kafka connector. At-least-once: a replayed batch is sent again, with the same batch id and
  record id headers, so consumers can drop the repeats (see :mod:`sparkstate.io.kafka`).

File, postgres, delta and kafka sinks need a checkpoint: it is what makes a restart resume where it
stopped, and what the exactly-once bookkeeping is keyed on. Two mistakes that would silently
lose or hide output are refused up front (for local paths): a *new* checkpoint on a file sink
directory that already holds committed batches (Spark would skip the new query's first
batches as "already committed"), and mixing the two file layouts (append and update) in one
directory.

>>> parse_sink("parquet:/data/sessions")
SinkSpec(kind='parquet', path='/data/sessions', url=None, table=None, name=None)
>>> parse_sink("parquet:/data/sessions").deadletter_default
'/data/sessions/_deadletter'
>>> str(parse_sink("postgres:postgresql://app:s3cret@db:5432/shop/sessions"))
'postgres:postgresql://app:***@db:5432/shop/sessions'
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Union, get_args

from .. import fs
from ..durations import Duration, positive_ms
from ..errors import ConfigError
from ..owed_batch import queue_owed_batch
from ..paths import local_path
from ..spark import is_connect, start_query
from .postgres import PostgresTarget, mask_url, parse_postgres_url
from .writers import CONSOLE_ROWS, FileBatchWriter, batch_writer, describe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("sparkstate.io.sinks")

SinkKind = Literal["console", "parquet", "json", "postgres", "memory", "delta", "kafka"]
OutputMode = Literal["append", "update"]
SINK_KINDS: tuple[str, ...] = get_args(SinkKind)
OUTPUT_MODES: tuple[str, ...] = get_args(OutputMode)

#: The accepted spec forms, as shown in error messages.
ACCEPTED_FORMS = ("console | memory | memory:NAME | parquet:DIR | json:DIR"
                  " | postgres:postgresql://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE/[SCHEMA.]TABLE"
                  " | delta:PATH | kafka:BROKERS/TOPIC")
#: Memory sink table name when neither the spec nor the query names one.
DEFAULT_MEMORY_NAME = "sparkstate_output"
#: Sub-directory of a file sink that holds dead letters by default (ignored by Spark readers: leading ``_``).
DEADLETTER_DIR = "_deadletter"
#: Sinks that need a checkpoint (what makes their output exactly-once across restarts).
NEED_CHECKPOINT = ("parquet", "json", "postgres", "delta", "kafka")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class SinkSpec:
    """A parsed sink spec. Build it with :func:`parse_sink`.

    ``path`` is set for file and delta sinks, ``url`` (without password) and ``table`` for
    postgres, ``url`` (the brokers) and ``table`` (the topic) for kafka, ``name`` for a named
    memory sink. A password given in a postgres URL is kept out of
    ``repr``, ``str`` and comparisons.

    >>> s = parse_sink("memory:sessions")
    >>> s.kind, s.name, s.deadletter_default
    ('memory', 'sessions', None)
    """

    kind: SinkKind
    path: str | None = None
    url: str | None = None
    table: str | None = None
    name: str | None = None
    password: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in SINK_KINDS:
            raise ConfigError(f"SinkSpec: kind must be one of {', '.join(SINK_KINDS)}, got {self.kind!r}")
        need = {"parquet": ("path",), "json": ("path",), "delta": ("path",), "postgres": ("url", "table"),
                "kafka": ("url", "table")}.get(self.kind, ())
        for attr in need:
            if not getattr(self, attr):
                raise ConfigError(f"SinkSpec: a {self.kind} sink needs {attr}=...; build specs with parse_sink(),"
                                  f" accepted forms: {ACCEPTED_FORMS}")

    @property
    def is_file(self) -> bool:
        """True for ``parquet`` and ``json``."""
        return self.kind in ("parquet", "json")

    @property
    def deadletter_default(self) -> str | None:
        """Where dead letters go by default: ``DIR/_deadletter`` for a file or delta sink, else ``None``.

        >>> parse_sink("json:out/").deadletter_default, parse_sink("console").deadletter_default
        ('out/_deadletter', None)
        """
        if not self.is_file and self.kind != "delta":
            return None
        return f"{(self.path or '').rstrip('/')}/{DEADLETTER_DIR}"

    @property
    def deadletter_sink(self) -> "SinkSpec | None":
        """:attr:`deadletter_default` as a sink of the same format (``None`` when there is no default).

        >>> parse_sink("parquet:/out").deadletter_sink
        SinkSpec(kind='parquet', path='/out/_deadletter', url=None, table=None, name=None)
        """
        where = self.deadletter_default
        return None if where is None else SinkSpec(self.kind, path=where)

    @property
    def postgres_target(self) -> PostgresTarget:
        """The postgres connection target (only for ``kind == "postgres"``)."""
        if self.kind != "postgres":
            raise ConfigError(f"SinkSpec: postgres_target is only defined for postgres sinks, this is {self.kind!r}")
        return PostgresTarget(url=self.url or "", table=self.table or "", password=self.password)  # parse_sink set both

    def __str__(self) -> str:
        if self.kind in ("parquet", "json", "delta"):
            return f"{self.kind}:{self.path}"
        if self.kind == "kafka":
            return f"kafka:{self.url}/{self.table}"
        if self.kind == "postgres":
            return f"postgres:{self.postgres_target.display}"
        if self.kind == "memory" and self.name:
            return f"memory:{self.name}"
        return self.kind


def parse_sink(text: str) -> SinkSpec:
    """Parse a sink spec: ``console``, ``memory[:NAME]``, ``parquet:DIR``, ``json:DIR``, ``postgres:URL/TABLE``, ``delta:PATH`` or ``kafka:BROKERS/TOPIC``.

    Bad specs raise :class:`~sparkstate.errors.ConfigError` naming the accepted forms.

    >>> parse_sink("console")
    SinkSpec(kind='console', path=None, url=None, table=None, name=None)
    >>> parse_sink("json:s3a://bucket/out").path
    's3a://bucket/out'
    >>> s = parse_sink("postgres:postgresql://app@db:5432/shop/public.sessions")
    >>> s.url, s.table
    ('postgresql://app@db:5432/shop', 'public.sessions')
    >>> k = parse_sink("kafka:localhost:9092/out")
    >>> k.kind, k.url, k.table, str(k)
    ('kafka', 'localhost:9092', 'out', 'kafka:localhost:9092/out')
    >>> parse_sink("ftp:host/out")
    Traceback (most recent call last):
    ...
    sparkstate.errors.ConfigError: sink: unknown sink 'ftp' in 'ftp:host/out'; expected one of: console | memory | memory:NAME | parquet:DIR | json:DIR | postgres:postgresql://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE/[SCHEMA.]TABLE | delta:PATH | kafka:BROKERS/TOPIC
    """
    if isinstance(text, SinkSpec):
        return text
    if not isinstance(text, str):
        raise ConfigError(f"sink: expected a spec string ({ACCEPTED_FORMS}), got {type(text).__name__}")
    raw = text.strip()
    shown = mask_url(raw)
    kind, sep, rest = raw.partition(":")
    kind = kind.lower()

    def bad(why: str) -> ConfigError:
        return ConfigError(f"sink: {why} in {shown!r}; expected one of: {ACCEPTED_FORMS}")

    if not raw:
        raise ConfigError(f"sink: empty spec; expected one of: {ACCEPTED_FORMS}")
    if kind == "console":
        if sep:
            raise bad("'console' takes no argument")
        return SinkSpec("console")
    if kind == "memory":
        if not sep:
            return SinkSpec("memory")
        if not _NAME.match(rest):
            raise bad(f"the memory sink's NAME must be a table name (letters, digits, _), got {rest!r}")
        return SinkSpec("memory", name=rest)
    if kind == "delta":
        if not rest.strip():
            raise bad("'delta' needs the table's directory, as delta:PATH")
        return SinkSpec("delta", path=rest.strip())
    if kind == "kafka":
        brokers, slash, topic = rest.strip().rpartition("/")
        if not slash or not brokers or not topic or "," in topic:
            raise bad("'kafka' needs the brokers and one topic, as kafka:HOST:PORT[,HOST:PORT...]/TOPIC")
        badb = [b for b in brokers.split(",") if not b.rpartition(":")[0] or not b.rpartition(":")[2].isdigit()]
        if badb:
            raise bad(f"Kafka brokers are host:port[,host:port...], got {', '.join(badb)}")
        return SinkSpec("kafka", url=brokers, table=topic)
    if kind in ("parquet", "json"):
        if not rest.strip():
            raise bad(f"'{kind}' needs an output directory, as {kind}:DIR")
        return SinkSpec(kind, path=rest.strip())  # type: ignore[arg-type]
    if kind == "postgres":
        if not rest.strip():
            raise bad("'postgres' needs a URL with the table, as postgres:postgresql://HOST/DATABASE/TABLE")
        target = parse_postgres_url(rest.strip())
        return SinkSpec("postgres", url=target.url, table=target.table, password=target.password)
    raise bad(f"unknown sink {kind!r}")


# --- checks on local paths before starting -------------------------------------------------

def _numbered(directory: str, spark: "SparkSession | None" = None) -> list[int]:
    return sorted(int(n.split(".")[0]) for n in fs.list_names(directory, spark) if n.split(".")[0].isdigit())


def check_sink_paths(spec: SinkSpec, checkpoint: str | None, output_mode: str,
                     layout: str | None = None, spark: "SparkSession | None" = None) -> None:
    """Refuse, before anything starts, what would silently lose or hide output (any filesystem Spark reaches).

    A memory sink on a checkpoint with progress (Spark cannot recover it); a file sink directory
    holding the other layout (append: ``_spark_metadata``; update: ``batch_id=N``); a file sink
    directory holding committed batches with a new checkpoint (the new query's first batches
    would be skipped as already written). ``layout``: the file sink's layout
    (:func:`~sparkstate.io.writers.file_layout`), by default that of ``output_mode`` on a classic session.
    ``spark``: the session whose Hadoop settings reach the paths (default: the active one).
    """
    try:
        _check_sink_paths(spec, checkpoint, output_mode, layout, spark)
    except fs.FsUnavailable as exc:  # Spark Connect, a store this process cannot reach
        log.warning("%s: the output directory and checkpoint were not checked: %s", spec, exc)


def _check_sink_paths(spec: SinkSpec, checkpoint: str | None, output_mode: str, layout: str | None,
                      spark: "SparkSession | None") -> None:
    layout = layout or ("log" if output_mode == "append" else "batches")
    ck = checkpoint or None
    fresh = ck is not None and not _numbered(fs.join(ck, "commits"), spark) and not _numbered(fs.join(ck, "offsets"), spark)
    if spec.kind == "memory" and ck is not None and not fresh:
        raise ConfigError(f"memory sink: the checkpoint {checkpoint!r} holds an earlier run, and Spark's memory sink"
                          " cannot recover from a checkpoint; use a new checkpoint directory (or a file sink to"
                          " test restarts)")
    if not spec.is_file:
        return
    out = spec.path or ""
    committed = _numbered(fs.join(out, "_spark_metadata"), spark)
    batch_dirs = [n for n in fs.list_names(out, spark) if n.startswith("batch_id=")]
    if layout == "batches" and committed:
        how = "in update mode" if output_mode == "update" else "over Spark Connect"
        raise ConfigError(f"{spec}: {how} batches go to {spec.path}/batch_id=N, but this directory holds"
                          " append-mode output (_spark_metadata), and readers would ignore the batch directories;"
                          " use another directory")
    if layout == "log" and batch_dirs:
        raise ConfigError(f"{spec}: this directory holds update-mode output (batch_id=N directories), which"
                          " Spark's append-mode file sink would hide from readers; use another directory")
    if fresh and (committed or batch_dirs):
        have = f"batches up to {committed[-1]}" if committed else f"{len(batch_dirs)} batch directories"
        raise ConfigError(f"{spec}: the directory already holds output of another query ({have}) but the"
                          f" checkpoint {checkpoint!r} is new, so the new query's first batches would be"
                          " skipped as already written; use an empty output directory, or the checkpoint"
                          " that wrote it")


# --- starting ------------------------------------------------------------------------------

def start_sink(
    df: "DataFrame",
    spec: Union[SinkSpec, str],
    checkpoint: str | Path | None = None,
    *,
    trigger: Duration | None = None,
    output_mode: OutputMode = "append",
    query_name: str | None = None,
) -> "StreamingQuery":
    """Start writing the streaming DataFrame ``df`` to ``spec``; return the running query.

    ``checkpoint`` is required for file and postgres sinks (optional for console and
    memory); ``trigger`` is a processing-time interval (``"1 second"``, a ``timedelta``, ms)
    or ``None`` for "as fast as possible"; ``output_mode`` is ``"append"`` or ``"update"``
    (in update mode a file sink writes one directory per batch, a postgres sink appends each
    batch's rows as they are). On a checkpoint whose query stopped before the no-data batch Spark
    owed it, that batch runs first (:func:`sparkstate.owed_batch.queue_owed_batch`).

    >>> import sparkstate as ss, tempfile
    >>> spark = ss.spark_session()
    >>> d = tempfile.mkdtemp()
    >>> _ = open(f"{d}/a.json", "w").write('{"user_id": "u1", "n": 1}\\n{"user_id": "u2", "n": 2}\\n')
    >>> stream = spark.readStream.schema("user_id string, n long").json(d)
    >>> query = start_sink(stream, parse_sink("memory:doc_sink"), checkpoint=f"{d}_ck")
    >>> query.processAllAvailable(); query.stop()
    >>> sorted(r.n for r in spark.table("doc_sink").collect())
    [1, 2]
    """
    spec = parse_sink(spec) if isinstance(spec, str) else spec
    mode, checkpoint, name = _start_settings(df, spec, checkpoint, output_mode, query_name)
    check_sink_paths(spec, checkpoint, mode, spark=df.sparkSession)
    writer = df.writeStream.outputMode(mode)
    # Over Spark Connect Spark's own memory and append-mode file sinks do what the writers below do
    # on a classic session (which drive Spark's file sink through the JVM, or keep rows here).
    native = is_connect(df.sparkSession) and (spec.kind == "memory" or (spec.is_file and mode == "append"))
    if trigger is not None:
        try:
            ms = positive_ms(trigger, f"start_sink({spec}): trigger")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        writer = writer.trigger(processingTime=f"{ms} milliseconds")
    if name:
        writer = writer.queryName(name)
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", checkpoint)
        queue_owed_batch(df.sparkSession, checkpoint)  # a restart fires the timeouts its last run left due
    log.info("starting sink %s (output mode %s, checkpoint %s)", describe(spec, mode), mode, checkpoint)
    what = f"query {name}" if name else "the sink's query"
    if native:
        if spec.kind == "memory":
            return start_query(writer.format("memory"), what)
        return start_query(writer.format(spec.kind).option("path", spec.path), what)
    write_batch = batch_writer(df.sparkSession, spec, mode, df.schema, name or DEFAULT_MEMORY_NAME,
                               checkpoint=checkpoint)
    return start_query(writer.foreachBatch(write_batch), what)


def _start_settings(df: "DataFrame", spec: SinkSpec, checkpoint: str | Path | None, output_mode: str,
                    query_name: str | None) -> tuple[str, str | None, str | None]:
    """:func:`start_sink`'s arguments checked: (output mode, checkpoint, query name)."""
    if not isinstance(spec, SinkSpec):
        raise ConfigError(f"start_sink: expected a SinkSpec or a spec string ({ACCEPTED_FORMS}),"
                          f" got {type(spec).__name__}")
    if not getattr(df, "isStreaming", False):
        raise ConfigError(f"start_sink({spec}): expected a streaming DataFrame (spark.readStream...), got"
                          f" {'a static DataFrame; write it with df.write' if hasattr(df, 'isStreaming') else type(df).__name__}")
    mode = output_mode.lower() if isinstance(output_mode, str) else output_mode
    if mode not in OUTPUT_MODES:
        raise ConfigError(f"start_sink({spec}): output_mode must be 'append' or 'update', got {output_mode!r}")
    ck = str(checkpoint) if checkpoint is not None else None
    if ck is None and spec.kind in NEED_CHECKPOINT:
        raise ConfigError(f"start_sink({spec}): a {spec.kind} sink needs checkpoint=DIR (it is what makes the"
                          " output exactly-once across restarts)")
    name = query_name
    if spec.kind == "memory":
        if spec.name and query_name and spec.name != query_name:
            raise ConfigError(f"start_sink({spec}): the memory sink's table is the query name; got the name"
                              f" {spec.name!r} in the spec and query_name={query_name!r}; give one")
        name = spec.name or query_name or DEFAULT_MEMORY_NAME
    return mode, ck, name


__all__ = ["ACCEPTED_FORMS", "CONSOLE_ROWS", "DEADLETTER_DIR", "FileBatchWriter", "OutputMode", "SinkKind", "SinkSpec",
           "check_sink_paths", "local_path", "parse_sink", "start_sink"]
