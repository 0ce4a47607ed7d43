"""The Kafka sink ``kafka:BROKERS/TOPIC``: each output row as one JSON message, keyed by its key column.

Spark's Kafka writer is *at-least-once*: Kafka has no way for Spark to commit a batch's
messages together with its checkpoint, so a batch that Spark runs again after a crash (the
driver died after sending and before its commit log) is sent again. Every message therefore
carries what a consumer needs to drop the repeats, in its headers:

- ``sparkstate.query_id``: the streaming query's id (kept in the checkpoint across restarts);
- ``sparkstate.batch_id``: the micro-batch that produced it;
- ``sparkstate.record_id``: a hash of the batch id, the key and the value. A replayed batch
  recomputes the same rows from the same input and state, so its messages have the same
  record ids: a consumer keeps the first message per ``(query_id, record_id)`` and drops the
  rest (:func:`dedupe` does so).

A job whose output and dead letters both go to Kafka sends them from its streaming query
(:func:`stream_records`), which cannot see the batch id: its messages carry
``sparkstate.batch_time`` (the batch's time in microseconds, which Spark's offset log keeps for a
replay) in its place, and the record id hashes that time.

Spark writes Kafka through its V1 interface unless told otherwise (``kafka`` is in
``spark.sql.sources.useV1SourceList``); the writer takes the V2 one, for its write only
(:func:`through_v2`). The messages are the same (the same producer, the same at-least-once);
the difference is that Spark reports an observation made in the written frame
(``DataFrame.observe``) for a V2 write and never for a V1 one, and the jobs count a batch's
parts in the job that sends them (:class:`~sparkstate.jobs.tee.JobTee`).

The message key is the row's key column (the first column: ``user_id`` for the ready
pipelines; a dead letter's ``source``) as a string, so all messages of a key land in one
partition, in order. A dead letter too large for one message (a record near the 1 MB limit:
``raw`` and base64 ``raw_bytes`` make twice that) keeps 1,024 characters of ``raw``, and leaves
``raw_bytes`` out, saying so in its reason, if it still does not fit. The value is
the row as JSON (``to_json``: timestamps ISO-8601), exactly the columns the Parquet sink
would write.

>>> KafkaBatchWriter("127.0.0.1:9092", "out")
KafkaBatchWriter('127.0.0.1:9092', 'out')
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator

from ..columns import BATCH_MICROS_SQL
from ..errors import SinkError
from .query_id import batch_query_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("sparkstate.io.kafka")

QUERY_ID_HEADER = "sparkstate.query_id"
BATCH_ID_HEADER = "sparkstate.batch_id"
#: The header naming the micro-batch by its time (microseconds) in a job's messages sent
#: straight by its streaming write (:func:`stream_records`), which cannot see the batch id.
BATCH_TIME_HEADER = "sparkstate.batch_time"
RECORD_ID_HEADER = "sparkstate.record_id"
#: Spark's setting that lists the data sources it reads and writes through their V1 interface.
V1_SOURCES = "spark.sql.sources.useV1SourceList"


#: The columns of a dead letter (:data:`sparkstate.io.parse.DEAD_LETTER_SCHEMA`).
DEAD_LETTER_COLUMNS = ("raw", "raw_bytes", "reason", "source", "received_at")
#: The most bytes a dead letter's JSON may take: under the producer's and the broker's default
#: limit of 1 MB per message (``max.request.size``, ``message.max.bytes``), with room for the key and headers.
MAX_DEAD_LETTER_BYTES = 1_000_000
_PREVIEW_CHARS = 1024


def _sql_text(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _fit_dead_letter(full: str) -> str:
    """A dead letter's JSON (the SQL expression ``full``), made to fit :data:`MAX_DEAD_LETTER_BYTES`.

    A record near the source's size limit does not fit twice (``raw`` and base64 ``raw_bytes``)
    in one message: its ``raw`` is cut to 1,024 characters first; if ``raw_bytes`` still does not
    fit, it is left out and the reason says so (a batch never fails on a large dead letter).
    """
    short_raw = (f"CASE WHEN char_length(raw) > {_PREVIEW_CHARS} THEN concat(substring(raw, 1, {_PREVIEW_CHARS}),"
                 " '... [truncated]') ELSE raw END")
    cut_raw = f"to_json(named_struct('raw', {short_raw}, 'raw_bytes', raw_bytes, 'reason', reason, 'source', source," \
              " 'received_at', received_at))"
    no_bytes = (f"to_json(named_struct('raw', {short_raw}, 'reason', concat(reason, '; raw_bytes left out: ',"
                " CAST(octet_length(raw_bytes) AS STRING), ' bytes do not fit in one Kafka message'), 'source', source,"
                " 'received_at', received_at))")
    return (f"CASE WHEN octet_length({full}) <= {MAX_DEAD_LETTER_BYTES} THEN {full}"
            f" WHEN octet_length({cut_raw}) <= {MAX_DEAD_LETTER_BYTES} THEN {cut_raw} ELSE {no_bytes} END")


def _record_id(batch: str, key: str, value: str) -> str:
    """The SQL of a message's record id: a hash of the batch (``batch``), its key and its value."""
    return f"sha2(concat_ws('\\u0000', {batch}, coalesce({key}, ''), {value}), 256)"


def _headers(query_id: str, batch: tuple[str, str], record_id: str) -> str:
    """The SQL of a message's headers: the query id, ``batch`` (its header's name and the SQL of
    its value) and the record id (SQL)."""

    def header(name: str, text: str) -> str:
        return f"named_struct('key', {_sql_text(name)}, 'value', CAST({text} AS BINARY))"

    return (f"array({header(QUERY_ID_HEADER, _sql_text(query_id))}, {header(*batch)},"
            f" {header(RECORD_ID_HEADER, record_id)})")


def stream_records(stream: "DataFrame", out: str, dead: str, topics: tuple[str, str | None],
                   query_id: str) -> "DataFrame":
    """A job's stream as the Kafka records of one streaming write, each with its ``topic``.

    Each row of ``stream`` has an output row (struct column ``out``) or a dead letter (struct
    column ``dead``, :data:`DEAD_LETTER_COLUMNS`); ``topics`` are the output's topic and the dead
    letters' (``None``: the stream has none). The messages are those :class:`KafkaBatchWriter`
    sends, keyed and valued the same, except that the micro-batch is named by its time (header
    :data:`BATCH_TIME_HEADER`, microseconds; the same on a replay) instead of its id, which a
    streaming write cannot see; the record id hashes that time in its place.
    """
    out_topic, dead_topic = topics
    key_field = stream.schema[out].dataType.fieldNames()[0]  # type: ignore[attr-defined]
    split = stream.selectExpr(out, f"{out} IS NOT NULL AS _is_out",
                              *(f"{dead}.{_sql_name(c)} AS {_sql_name(c)}" for c in DEAD_LETTER_COLUMNS))
    dead_value = _fit_dead_letter("to_json(named_struct(" + ", ".join(
        f"{_sql_text(c)}, {_sql_name(c)}" for c in DEAD_LETTER_COLUMNS) + "))")
    key = f"CASE WHEN _is_out THEN CAST({out}.{_sql_name(key_field)} AS STRING) ELSE source END"
    value = f"CASE WHEN _is_out THEN to_json({out}) ELSE {dead_value} END"
    topic = f"CASE WHEN _is_out THEN {_sql_text(out_topic)} ELSE {_sql_text(dead_topic or out_topic)} END"
    # The batch's time read once per row (``reflect``, non-deterministic: Spark keeps it one column).
    keyed = split.selectExpr(f"{topic} AS topic", f"{key} AS key", f"{value} AS value", f"{BATCH_MICROS_SQL} AS _batch")
    headers = _headers(query_id, (BATCH_TIME_HEADER, "_batch"), _record_id("_batch", "key", "value"))
    return keyed.selectExpr("topic", "key", "value", f"{headers} AS headers")


@contextmanager
def through_v2(spark: "SparkSession") -> Iterator[None]:
    """Kafka left out of :data:`V1_SOURCES` in ``spark``'s settings while the block runs (then the
    setting as it was): a write made in the block goes through the V2 interface, which reports
    the written frame's observations (see the module).

    >>> import sparkstate as ss
    >>> spark = ss.spark_session()
    >>> with through_v2(spark):
    ...     "kafka" in spark.conf.get(V1_SOURCES)
    False
    >>> "kafka" in spark.conf.get(V1_SOURCES)
    True
    """
    before = spark.conf.get(V1_SOURCES) or ""
    kept = [name for name in before.split(",") if name.strip().lower() != "kafka"]
    if len(kept) == len(before.split(",")):
        yield
        return
    spark.conf.set(V1_SOURCES, ",".join(kept))
    try:
        yield
    finally:
        spark.conf.set(V1_SOURCES, before)


class KafkaBatchWriter:
    """The ``foreachBatch`` function of the ``kafka:BROKERS/TOPIC`` sink (at-least-once; see the module)."""

    def __init__(self, brokers: str, topic: str, *, key_column: str | None = None,
                 options: dict[str, str] | None = None, checkpoint: str | None = None) -> None:
        self.brokers = brokers
        self.checkpoint = checkpoint  # where the query id is read over Spark Connect
        self.topic = topic
        self.key_column = key_column
        self.options = dict(options or {})

    def __repr__(self) -> str:
        return f"KafkaBatchWriter({self.brokers!r}, {self.topic!r})"

    def frame(self, batch_df: "DataFrame", batch_id: int, query_id: str = "") -> "DataFrame":
        """``batch_df`` as Kafka records: key, value (JSON) and the de-duplication headers.

        Written as SQL text: one call into the JVM per batch, where building the same
        expression from column objects made about a hundred (a small batch's fixed cost)."""
        cols = batch_df.columns
        dead_letters = cols == list(DEAD_LETTER_COLUMNS)
        key = self.key_column or ("source" if dead_letters else cols[0])
        value = "to_json(named_struct(" + ", ".join(f"{_sql_text(c)}, {_sql_name(c)}" for c in cols) + "))"
        if dead_letters:
            value = _fit_dead_letter(value)
        key_text = f"CAST({_sql_name(key)} AS STRING)"
        batch = _sql_text(str(batch_id))
        headers = _headers(query_id, (BATCH_ID_HEADER, batch), _record_id(batch, key_text, value))
        return batch_df.selectExpr(f"{key_text} AS key", f"{value} AS value", f"{headers} AS headers")

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        try:
            query_id = batch_query_id(batch_df, f"kafka:{self.brokers}/{self.topic}", "checkpoint=", self.checkpoint)
        except SinkError:  # outside a stream: the messages carry no query id
            query_id = ""
        with through_v2(batch_df.sparkSession):
            (self.frame(batch_df, batch_id, query_id).write.format("kafka").mode("append")
             .option("kafka.bootstrap.servers", self.brokers).option("topic", self.topic)
             .options(**self.options).save())
        log.info("kafka:%s/%s: batch %d sent", self.brokers, self.topic, batch_id)


def headers_of(message_headers: Iterable | None) -> dict[str, str]:
    """A message's headers (``[(key, bytes), ...]`` as clients give them) as a dict of strings."""
    return {k: (v.decode() if isinstance(v, (bytes, bytearray)) else v) for k, v in (message_headers or [])}


def dedupe(messages: Iterable, headers=lambda m: m.headers()) -> list:
    """Keep the first of each ``(query_id, record_id)`` in ``messages`` (in the order given); drop the repeats.

    >>> class M:
    ...     def __init__(self, h): self.h = h
    ...     def headers(self): return self.h
    >>> ms = [M([("sparkstate.query_id", b"q"), ("sparkstate.record_id", b"a")]),
    ...       M([("sparkstate.query_id", b"q"), ("sparkstate.record_id", b"a")]),
    ...       M([("sparkstate.query_id", b"q"), ("sparkstate.record_id", b"b")])]
    >>> len(dedupe(ms))
    2
    """
    seen: set[tuple[str, str]] = set()
    out = []
    for m in messages:
        h = headers_of(headers(m))
        ident = (h.get(QUERY_ID_HEADER, ""), h.get(RECORD_ID_HEADER, ""))
        if ident in seen:
            continue
        seen.add(ident)
        out.append(m)
    return out


__all__ = ["BATCH_ID_HEADER", "BATCH_TIME_HEADER", "KafkaBatchWriter", "QUERY_ID_HEADER", "RECORD_ID_HEADER",
           "V1_SOURCES", "dedupe", "headers_of", "stream_records", "through_v2"]
