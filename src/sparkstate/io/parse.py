"""Raw records -> typed rows or dead letters, with Spark SQL functions (no per-row Python).

Every input record lands in exactly one of two outputs: a typed row with exactly the schema's
columns (``events``), or a dead letter ``raw, raw_bytes, reason, source, received_at`` (``dead_letters``).
``raw`` is valid UTF-8 text (invalid bytes replaced by U+FFFD), ``raw_bytes`` the exact bytes.
Both are filters of one checked frame on one deterministic ``reason`` column (null for a good
record), so they are complements by construction. A record is dead when it

- is larger than ``max_record_bytes`` (not parsed at all; its ``raw`` is cut to 1 KiB, ``raw_bytes`` keeps it whole),
- does not parse: ``"not valid JSON"``, ``"not a JSON object"``, ``"not valid CSV ..."``,
- lacks a required field (``"missing field user_id"``) or has it null (``"field user_id is
  null"``; in CSV ``"... is empty"``),
- has a timestamp or date outside the years 1 to 9999 (``"field t: timestamp out of range ..."``),
- has a field of the wrong type (``"field event_time: expected timestamp, got 'abc'"``):
  Spark's parser quietly turns such a field into null, so each field's raw text (a JSON
  object parsed as a string map, or the CSV tokens parsed as strings) is compared with its
  typed value.

All reasons of a record are joined with ``"; "``. Fields not in the schema are ignored;
whitespace-only lines are not records (as in Spark's own JSON and CSV readers). Types are
checked at the top level (a wrong type inside a nested struct reads as null).

>>> import sparkstate as ss
>>> spark = ss.spark_session()
>>> raw = spark.createDataFrame([('{"id": "a", "n": 1}',), ('{"id": "b", "n": "x"}',), ('{"n": 2}',), ("{oops",)],
...                             "value string")
>>> parsed = parse_json(raw, "id string, n bigint", required=["id"], source="doc")
>>> parsed.events.collect()
[Row(id='a', n=1)]
>>> [r.reason for r in parsed.dead_letters.collect()]
["field n: expected bigint, got 'x'", 'missing field id', 'not valid JSON']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType, StructField, StructType

from ..columns import batch_time, once
from ..errors import ConfigError

#: The columns of a dead-letter output. ``raw`` is always valid UTF-8 text (invalid bytes each
#: replaced by U+FFFD; valid text unchanged); ``raw_bytes`` is the record exactly as read.
DEAD_LETTER_SCHEMA = "raw string, raw_bytes binary, reason string, source string, received_at timestamp"
#: Records larger than this (in UTF-8 bytes) are dead letters without being parsed.
DEFAULT_MAX_RECORD_BYTES = 1_000_000
#: The dead letter's time: the micro-batch's (:func:`sparkstate.columns.batch_time`; the same on a replay).
RECEIVED_AT = "received_at"
#: How much of an oversized record its dead letter keeps.
RAW_PREVIEW_CHARS = 1024
# How much of a wrongly typed value a reason quotes.
_VALUE_PREVIEW_CHARS = 60

# Internal column names of the checked frame.
RAW, REASON, SOURCE = "_sparkstate_raw", "_sparkstate_reason", "_sparkstate_source"
_CORRUPT = "_sparkstate_corrupt"
_TYPED, _MAP, _FIELDS = "_sparkstate_typed", "_sparkstate_map", "_sparkstate_field_reasons"
#: The characters Spark's CSV parser (univocity) reads at a time, per parser. Its default, 1M
#: characters, is a 2 MB array for every parser (each file read, each from_csv in each task): a
#: "humongous" object for the JVM's G1 collector that fragments a 1 GB heap until it runs out.
CSV_INPUT_BUFFER_CHARS = 16384


@dataclass(frozen=True)
class Parsed:
    """The two outputs of a parse, and the frame both are filtered from.

    ``checked`` holds every record: the schema's columns plus ``_sparkstate_raw``,
    ``_sparkstate_reason`` (null for a good record) and ``_sparkstate_source``; a single
    ``foreachBatch`` query can split it itself.
    """

    events: DataFrame
    dead_letters: DataFrame
    checked: DataFrame


def to_struct(schema: str | StructType) -> StructType:
    """A DDL string (``"user_id string not null, n bigint"``) or a ``StructType`` as a ``StructType``.

    Parsing DDL needs a running SparkSession.

    >>> import sparkstate as ss
    >>> _ = ss.spark_session()
    >>> to_struct("id string not null, n bigint").fieldNames()
    ['id', 'n']
    """
    if isinstance(schema, StructType):
        return schema
    if not isinstance(schema, str) or not schema.strip():
        raise ConfigError(f"schema: expected a DDL string such as 'user_id string, n bigint' or a StructType, got {schema!r}")
    from ..ddl import NoSparkError, parse_ddl

    try:
        parsed = parse_ddl(schema)
    except NoSparkError:
        raise ConfigError(
            f"schema: parsing the DDL string {schema!r} needs a running SparkSession;"
            " start one first (ss.spark_session()) or pass a StructType"
        ) from None
    except Exception as exc:  # a ParseException from Spark
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"schema: cannot parse {schema!r} as a DDL schema: {first}") from None
    if not isinstance(parsed, StructType):
        raise ConfigError(f"schema: expected a list of columns such as 'user_id string, n bigint', got {schema!r}")
    return parsed


def required_fields(schema: StructType, required: Iterable[str] | None) -> tuple[str, ...]:
    """The fields a record must carry (non-null): ``required`` if given (checked against the
    schema), else the schema's ``NOT NULL`` fields, else every field.

    >>> import sparkstate as ss
    >>> _ = ss.spark_session()
    >>> s = to_struct("id string not null, n bigint")
    >>> required_fields(s, None), required_fields(to_struct("a int, b int"), None), required_fields(s, ["n"])
    (('id',), ('a', 'b'), ('n',))
    """
    names = schema.fieldNames()
    if required is None:
        strict = tuple(f.name for f in schema.fields if not f.nullable)
        return strict or tuple(names)
    if isinstance(required, str):
        required = [required]
    wanted = tuple(required)
    unknown = [r for r in wanted if r not in names]
    if unknown:
        raise ConfigError(
            f"required: {', '.join(map(repr, unknown))} not in the schema; its columns are {', '.join(names)}"
        )
    return wanted


def _ddl(schema: StructType) -> str:
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)


def _source_col(source: str | Column | None) -> Column:
    if source is None:
        return F.lit(None).cast("string")
    return source if isinstance(source, Column) else F.lit(str(source))


def _preview(value: Column) -> Column:
    cut = F.substring(value, 1, _VALUE_PREVIEW_CHARS)
    return F.when(F.length(value) > _VALUE_PREVIEW_CHARS, F.concat(cut, F.lit("..."))).otherwise(value)


def _field_reason(name: str, dtype: str, text: Column, typed: Column, absent: list[tuple[Column, str | None]]) -> Column:
    """One field's reason as one ``CASE`` (a field has at most one): the ``absent`` cases in turn
    (a condition and its reason, or None for none; together they cover a null ``text``), then
    ``text`` that did not type, then a date or timestamp outside the years 1 to 9999."""
    first, *rest = [(cond, F.lit(why) if why is not None else F.lit(None).cast("string")) for cond, why in absent]
    reason = F.when(*first)
    for cond, value in rest:
        reason = reason.when(cond, value)
    reason = reason.when(
        typed.isNull(), F.concat(F.lit(f"field {name}: expected {dtype}, got '"), _preview(text), F.lit("'")),
    )
    if dtype not in ("timestamp", "timestamp_ntz", "date"):
        return reason
    # Spark holds years far outside 1-9999, which Python, pandas and most sinks cannot: a dead letter.
    year = F.year(typed)
    return reason.when(
        (year < 1) | (year > 9999),
        F.concat(F.lit(f"field {name}: {dtype} out of range (years 1 to 9999), got '"), _preview(text), F.lit("'")),
    )


def _joined(field_reasons: list[Column]) -> Column:
    """The fields' reasons joined with ``"; "`` (``""`` for none), as the column :data:`_FIELDS`.

    A column of its own, computed once: ``nullif(x, "")`` in the reason would be ``if(x = "",
    null, x)`` with ``x`` copied twice (Spark 3.5 to 4.3 rewrite it so), and the optimizer and the
    code generator would walk every field's checks twice in every micro-batch's plan.
    """
    return once(F.concat_ws("; ", *field_reasons)).alias(_FIELDS)


def _field_reasons_or_null() -> Column:
    """The column :func:`_joined` made, null when no field has a reason."""
    return F.nullif(F.col(_FIELDS), F.lit(""))


def _too_large(raw: Column, max_record_bytes: int) -> Column:
    size = F.octet_length(raw)
    return F.when(
        size > max_record_bytes,
        F.format_string(f"record is %d bytes, over the limit of {max_record_bytes} bytes (max_record_bytes)", size),
    )


def _check_max(max_record_bytes: int) -> int:
    if not isinstance(max_record_bytes, int) or isinstance(max_record_bytes, bool) or max_record_bytes < 1:
        raise ConfigError(f"max_record_bytes must be a positive whole number, got {max_record_bytes!r}")
    return max_record_bytes


def dead_raw(raw: Column) -> tuple[Column, Column]:
    """``raw`` as the two dead-letter columns: valid text (``raw``) and the exact bytes (``raw_bytes``).

    A Spark string read from bytes (a Kafka value cast to string, a file line) keeps invalid
    UTF-8 as it is; cast to binary it gives back those exact bytes, and ``make_valid_utf8``
    replaces each invalid sequence with U+FFFD, leaving valid text byte-identical.
    """
    return valid_utf8(raw), raw.cast("binary")


def dead_letter_raw(raw: Column, max_record_bytes: int) -> tuple[Column, Column]:
    """A record as read, as its dead letter's ``raw`` and ``raw_bytes`` (:func:`dead_raw`), with
    ``raw`` cut to its first :data:`RAW_PREVIEW_CHARS` characters when the record is larger than
    ``max_record_bytes``."""
    text, data = dead_raw(raw)
    kept = F.when(
        F.octet_length(raw) > max_record_bytes, F.concat(F.substring(text, 1, RAW_PREVIEW_CHARS), F.lit("... [truncated]")),
    ).otherwise(text)
    return kept, data


def valid_utf8(text: Column) -> Column:
    """``text`` with each invalid UTF-8 sequence replaced by U+FFFD, valid text byte-identical:
    ``make_valid_utf8`` (Spark 4.0+); on Spark 3.5, its bytes decoded as UTF-8 (Java's decoder
    replaces what is malformed the same way)."""
    if hasattr(F, "make_valid_utf8"):
        return F.make_valid_utf8(text)
    return F.decode(text.cast("binary"), "UTF-8")


def _split(checked: DataFrame, schema: StructType, max_record_bytes: int) -> Parsed:
    reason = F.col(REASON)
    events = checked.where(reason.isNull()).select(*[F.col(f"`{n}`") for n in schema.fieldNames()])
    kept_raw, data = dead_letter_raw(F.col(RAW), max_record_bytes)
    dead = checked.where(reason.isNotNull()).select(
        kept_raw.alias("raw"),
        data.alias("raw_bytes"),
        reason.alias("reason"),
        F.col(SOURCE).alias("source"),
        batch_time().alias(RECEIVED_AT),
    )
    return Parsed(events, dead, checked)


def _not_blank(raw: Column) -> Column:
    return raw.isNull() | (F.trim(raw) != "")


def parse_json(
    raw: DataFrame,
    schema: str | StructType,
    *,
    column: str = "value",
    source: str | Column | None = None,
    required: Iterable[str] | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    options: Mapping[str, str] | None = None,
) -> Parsed:
    """Parse the JSON-lines text in ``raw[column]`` against ``schema`` (streaming or static).

    ``source`` (a string or a Column) fills the dead letters' ``source``; ``required`` names the
    fields a record must carry (see :func:`required_fields`); ``options`` are Spark's JSON
    options (``timestampFormat``, ``allowComments``, ...).

    >>> import sparkstate as ss
    >>> raw = ss.spark_session().createDataFrame([('{"t": "2024-01-01T00:00:00Z"}',), ('{"t": "soon"}',)], "value string")
    >>> [r.reason for r in parse_json(raw, "t timestamp").dead_letters.collect()]
    ["field t: expected timestamp, got 'soon'"]
    """
    struct = to_struct(schema)
    need = required_fields(struct, required)
    limit = _check_max(max_record_bytes)
    if column not in raw.columns:
        raise ConfigError(f"parse_json: column {column!r} is not in the input; its columns are {', '.join(raw.columns)}")
    opts = {k: str(v) for k, v in (options or {}).items() if k not in ("mode", "columnNameOfCorruptRecord")}
    opts["mode"] = "PERMISSIVE"
    v = F.col(f"`{column}`")
    size_ok = F.when(F.octet_length(v) <= limit, v)
    # Each record parsed once per step: as a string map (each field's raw text) and typed, each
    # one column (sparkstate.columns.once: else Spark copies each parse into every reason and
    # column, 80 to 150 copies in a plan, each with its own parser and buffer per task).
    step = raw.where(_not_blank(v)).select(
        v.alias(RAW), _source_col(source).alias(SOURCE),
        F.from_json(once(size_ok), MapType(StringType(), StringType()), opts).alias(_MAP),
        F.from_json(once(size_ok), struct, opts).alias(_TYPED))
    line, as_map, typed = F.col(RAW), F.col(_MAP), F.col(_TYPED)
    fits = F.when(F.octet_length(line) <= limit, line)
    structure = F.when(line.isNull(), F.lit("empty record")).when(
        fits.isNotNull() & as_map.isNull(),
        F.when(F.get_json_object(fits, "$").isNotNull(), F.lit("not a JSON object")).otherwise(F.lit("not valid JSON")),
    )
    # Each field's text looked up once per record, a column of its own (else each of its reasons'
    # reads is a lookup of its own in the generated code).
    texts = [f"_sparkstate_text_{i}" for i in range(len(struct.fields))]
    step = step.select("*", *[once(F.try_element_at(as_map, F.lit(f.name))).alias(t)
                              for f, t in zip(struct.fields, texts)])
    field_reasons = []
    for f, t in zip(struct.fields, texts):
        text = F.col(t)
        absent: list[tuple[Column, str | None]] = [(text.isNull(), None)]
        if f.name in need:
            has = F.map_contains_key(as_map, f.name)  # a literal: PySpark 3.5 takes no Column here
            absent = [(~has, f"missing field {f.name}"), (text.isNull(), f"field {f.name} is null")]
        field_reasons.append(_field_reason(f.name, f.dataType.simpleString(), text, typed.getField(f.name), absent))
    step = step.select("*", _joined(field_reasons))
    reason = F.coalesce(_too_large(line, limit), structure, _field_reasons_or_null())
    checked = step.select(
        *[typed.getField(f.name).alias(f.name) for f in struct.fields],
        line,
        once(reason).alias(REASON),
        F.col(SOURCE),
    )
    return _split(checked, struct, limit)


def csv_string_schema(schema: StructType) -> StructType:
    """``schema`` with every field a nullable string, plus the corrupt-record column: what a
    CSV record is first read as (so a wrong type cannot hide, and the raw text is kept).

    >>> from pyspark.sql.types import LongType
    >>> csv_string_schema(StructType([StructField("n", LongType())])).simpleString()
    'struct<n:string,_sparkstate_corrupt:string>'
    """
    return StructType(
        [StructField(f.name, StringType(), True) for f in schema.fields] + [StructField(_CORRUPT, StringType(), True)]
    )


def csv_read_options(options: Mapping[str, str] | None = None) -> dict[str, str]:
    """The options for reading CSV with :func:`csv_string_schema` (PERMISSIVE, corrupt column).

    >>> csv_read_options({"sep": ";", "mode": "FAILFAST"})["mode"]
    'PERMISSIVE'
    """
    opts = {"inputBufferSize": str(CSV_INPUT_BUFFER_CHARS), **{k: str(v) for k, v in (options or {}).items()}}
    opts.update({"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
    return opts


def csv_parse_options(options: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CSV options of ``to_csv``/``from_csv`` when typing tokens: the user's parser options
    (not the reader's ``mode``, corrupt column nor ``header``) and a bounded input buffer.

    >>> csv_parse_options({"sep": ";", "header": "true"})
    {'inputBufferSize': '16384', 'sep': ';'}
    """
    opts = {k: str(v) for k, v in (options or {}).items() if k not in ("mode", "columnNameOfCorruptRecord", "header")}
    return {"inputBufferSize": str(CSV_INPUT_BUFFER_CHARS), **opts}


def check_csv_tokens(
    tokens: DataFrame,
    schema: str | StructType,
    *,
    source: str | Column | None = None,
    raw: Column | None = None,
    required: Iterable[str] | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    options: Mapping[str, str] | None = None,
) -> Parsed:
    """Type-check CSV records already split into string columns (as :func:`csv_string_schema`).

    ``raw`` is the record's text (default: the corrupt-record text, or the tokens written back
    as CSV). Used for CSV files read with Spark's CSV reader; :func:`parse_csv` for text lines.

    >>> import sparkstate as ss
    >>> tokens = ss.spark_session().createDataFrame([("a", "1", None), ("b", "x", None)],
    ...                                             "id string, n string, _sparkstate_corrupt string")
    >>> p = check_csv_tokens(tokens, "id string, n int")
    >>> [r.id for r in p.events.collect()], [(r.raw, r.reason) for r in p.dead_letters.collect()]
    (['a'], [('b,x', "field n: expected int, got 'x'")])
    """
    struct = to_struct(schema)
    need = required_fields(struct, required)
    limit = _check_max(max_record_bytes)
    opts = csv_parse_options(options)
    strings = [F.col(f"`{f.name}`") for f in struct.fields]
    corrupt = F.col(_CORRUPT)
    # to_csv fails on a row whose fields are all null (a lone quoted empty field): write it by hand.
    sep = opts.get("sep", opts.get("delimiter", ","))
    all_empty = sep * (len(strings) - 1) if len(strings) > 1 else '""'
    text_line = F.when(F.coalesce(*strings).isNull(), F.lit(all_empty)).otherwise(F.to_csv(F.struct(*strings), opts))
    raw_col = raw if raw is not None else F.coalesce(corrupt, text_line)
    # Step 1: the tokens, the record's text and its origin, each computed once.
    step = tokens.select(*strings, corrupt, raw_col.alias(RAW), _source_col(source).alias(SOURCE))
    # Step 2: the fields that are not strings typed by ONE from_csv per record (a string field is its
    # token as read: the CSV round trip would lose a NUL, Spark's "no character"), and only for a
    # record within the size limit and of the right shape: one parser (its buffer bounded by
    # csv_parse_options) per task, whatever the record.
    typed_fields = [f for f in struct.fields if not isinstance(f.dataType, StringType)]
    if typed_fields:
        fits = (F.octet_length(F.col(RAW)) <= limit) & corrupt.isNull()
        line = F.when(fits, F.when(F.coalesce(*strings).isNull(), F.lit(all_empty))
                      .otherwise(F.to_csv(F.struct(*strings), opts)))
        step = step.select("*", F.from_csv(once(line), _ddl(struct), {**opts, "mode": "PERMISSIVE"}).alias(_TYPED))
    typed = {f.name: F.col(_TYPED).getField(f.name) for f in typed_fields}
    fields = [typed.get(f.name, t) for f, t in zip(struct.fields, strings)]
    names = ", ".join(struct.fieldNames())
    structure = F.when(corrupt.isNotNull(), F.lit(f"not valid CSV: expected {len(struct.fields)} fields ({names})"))
    field_reasons = []
    for f, token, value in zip(struct.fields, strings, fields):
        empty = f"field {f.name} is empty" if f.name in need else None
        if f.name in typed:
            field_reasons.append(_field_reason(f.name, f.dataType.simpleString(), token, value, [(token.isNull(), empty)]))
        elif empty:
            field_reasons.append(F.when(token.isNull(), F.lit(empty)))
    step = step.select("*", _joined(field_reasons))
    reason = F.coalesce(_too_large(F.col(RAW), limit), structure, _field_reasons_or_null())
    checked = step.select(
        *[c.alias(f.name) for f, c in zip(struct.fields, fields)],
        F.col(RAW),
        once(reason).alias(REASON),
        F.col(SOURCE),
    )
    return _split(checked, struct, limit)


def parse_csv(
    raw: DataFrame,
    schema: str | StructType,
    *,
    column: str = "value",
    source: str | Column | None = None,
    required: Iterable[str] | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    options: Mapping[str, str] | None = None,
) -> Parsed:
    """Parse CSV text lines (no header) in ``raw[column]`` against ``schema``, by position.

    >>> import sparkstate as ss
    >>> raw = ss.spark_session().createDataFrame([("a,1",), ("b,x",), ("c",)], "value string")
    >>> p = parse_csv(raw, "id string, n int")
    >>> p.events.collect(), [r.reason for r in p.dead_letters.collect()]
    ([Row(id='a', n=1)], ["field n: expected int, got 'x'", 'not valid CSV: expected 2 fields (id, n)'])
    """
    struct = to_struct(schema)
    limit = _check_max(max_record_bytes)
    if column not in raw.columns:
        raise ConfigError(f"parse_csv: column {column!r} is not in the input; its columns are {', '.join(raw.columns)}")
    v = F.col(f"`{column}`")
    size_ok = F.when(F.octet_length(v) <= limit, v)
    # The line split once (one from_csv per record, behind a barrier as in check_csv_tokens).
    tokens = raw.where(_not_blank(v)).select(
        F.from_csv(once(size_ok), _ddl(csv_string_schema(struct)), csv_read_options(options)).alias(_TYPED),
        v.alias(RAW), _source_col(source).alias(SOURCE))
    split = tokens.select(
        *[F.col(_TYPED).getField(f.name).alias(f.name) for f in struct.fields],
        # A null line (or one too large to parse) has no tokens: mark it corrupt unless too large.
        F.when(F.col(RAW).isNull(), F.lit("")).otherwise(F.col(_TYPED).getField(_CORRUPT)).alias(_CORRUPT),
        F.col(RAW),
        F.col(SOURCE),
    )
    return check_csv_tokens(
        split, struct, source=F.col(SOURCE), raw=F.col(RAW), required=required,
        max_record_bytes=limit, options=options,
    )


__all__ = [
    "DEAD_LETTER_SCHEMA",
    "dead_raw",
    "DEFAULT_MAX_RECORD_BYTES",
    "Parsed",
    "check_csv_tokens",
    "csv_parse_options",
    "csv_read_options",
    "csv_string_schema",
    "parse_csv",
    "parse_json",
    "required_fields",
    "to_struct",
]
