"""The PostgreSQL sink: each micro-batch written exactly once, in one transaction with its batch id.

How a micro-batch is written (:class:`PostgresBatchWriter`, called by ``foreachBatch`` on the
driver):

1. The batch is collected to the driver as Arrow (``DataFrame.toArrow()``, on PySpark 3.5 its
   Arrow batches: :func:`sparkstate.engines.runtime.collect_arrow`). This is meant for
   the volumes of one micro-batch of a streaming job (thousands to a few million rows), not
   for bulk loads: the whole batch is held in driver memory while it is copied.
2. An empty batch writes nothing and opens no connection.
3. One transaction: ``INSERT`` the pair (sink id, batch id) into the progress table
   ``sparkstate_sink_batches`` with ``ON CONFLICT DO NOTHING``. No row inserted means the
   batch was already committed (a replay after a crash between this commit and Spark's commit
   log): the transaction is rolled back and the batch skipped. Otherwise the rows go in with
   ``COPY`` and the transaction commits; rows and batch id become visible together or not at
   all. The primary key also serialises two writers racing on the same batch.

The sink id is ``TABLE@QUERY_ID``: Spark's query id is stored in the checkpoint, so a restart
on the same checkpoint keeps it (and replays are recognised), while a new checkpoint starts a
new id whose batch ids (from 0 again) do not collide with the old ones.

The target table is created from the DataFrame's schema when missing (:func:`pg_type`); an
existing table must have every column of the DataFrame. Credentials: a password in the URL,
else the file named by ``SPARKSTATE_PG_PASSWORD_FILE``, else whatever libpq finds itself
(``PGPASSWORD``, ``PGPASSFILE`` / ``~/.pgpass``). Passwords never appear in log lines or
exception messages: URLs are shown masked (:func:`mask_url`).

>>> from pyspark.sql.types import ArrayType, LongType, StringType, TimestampType
>>> pg_type(LongType()), pg_type(TimestampType()), pg_type(ArrayType(StringType()))
('bigint', 'timestamptz', 'text[]')
>>> mask_url("postgresql://app:s3cret@db:5432/shop")
'postgresql://app:***@db:5432/shop'
"""

from __future__ import annotations

import base64
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Literal
from urllib.parse import quote, unquote, urlsplit

from ..engines.runtime import collect_arrow
from ..errors import ConfigError, SinkError
from .query_id import batch_query_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger("sparkstate.io.postgres")

#: The progress table (created beside the target table, in the same schema).
PROGRESS_TABLE = "sparkstate_sink_batches"
#: Environment variable naming a file that holds the password (first line).
PASSWORD_FILE_ENV = "SPARKSTATE_PG_PASSWORD_FILE"
INSTALL_HINT = "pip install 'sparkstate[postgres]'"

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\Z")
_URL_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@")


def mask_url(text: str, password: str | None = None) -> str:
    """``text`` with the password of any ``postgresql://user:PASSWORD@`` URL, and ``password``, masked.

    >>> mask_url("could not connect to postgres://u:pw@h/db")
    'could not connect to postgres://u:***@h/db'
    >>> mask_url("auth failed for 'hunter2'", password="hunter2")
    "auth failed for '***'"
    """
    out = _URL_PASSWORD.sub(r"\1***@", text)
    if password:
        for form in {password, quote(password, safe="")}:
            out = out.replace(form, "***")
    return out


def _join(scheme: str, netloc: str, path: str, query: str) -> str:
    # urlunsplit drops the "//" of an empty host (postgresql:///db means the local socket).
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")


@dataclass(frozen=True)
class PostgresTarget:
    """Where the rows go: a connection URL without password, a table, and the password if given.

    The password is kept out of ``repr`` and ``str``; :attr:`display` is the masked form.
    """

    url: str
    table: str
    password: str | None = field(default=None, repr=False, compare=False)

    @property
    def display(self) -> str:
        """The target as ``postgresql://user:***@host:port/db/TABLE`` (``***`` only if a password was given)."""
        parts = urlsplit(self.url)
        netloc = parts.netloc
        if self.password is not None:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user}:***@{host}"
        return _join(parts.scheme, netloc, f"{parts.path}/{self.table}", parts.query)

    @property
    def schema_name(self) -> str | None:
        return self.table.split(".")[0] if "." in self.table else None

    @property
    def table_name(self) -> str:
        return self.table.split(".")[-1]


ACCEPTED_URL = ("postgres:postgresql://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE/[SCHEMA.]TABLE[?PARAM=VALUE&...]"
                " (postgres:// also accepted)")


def parse_postgres_url(text: str) -> PostgresTarget:
    """Split ``postgresql://user:pw@host:port/db/[schema.]table?params`` into a :class:`PostgresTarget`.

    >>> t = parse_postgres_url("postgresql://app:s3cret@db.local:5433/shop/public.sessions?sslmode=require")
    >>> t.url, t.table, t.display
    ('postgresql://app@db.local:5433/shop?sslmode=require', 'public.sessions', 'postgresql://app:***@db.local:5433/shop/public.sessions?sslmode=require')
    >>> t
    PostgresTarget(url='postgresql://app@db.local:5433/shop?sslmode=require', table='public.sessions')
    """
    shown = mask_url(text)

    def bad(why: str) -> ConfigError:
        return ConfigError(f"postgres sink: {why} in {shown!r}; expected {ACCEPTED_URL}")

    try:
        parts = urlsplit(text)
        port = parts.port  # validates the port
    except ValueError:
        # urllib's message may quote a piece of a password holding an unencoded / : @ (read as the
        # port): say what to check, and show nothing of what is before the last @.
        raise bad("unreadable URL (is the port a number? a password with : / @ ? # must be percent-encoded)") from None
    if parts.scheme not in ("postgresql", "postgres") or not text.startswith(parts.scheme + "://"):
        raise bad("the URL must start with postgresql://")
    if parts.fragment:
        raise bad("unexpected '#' fragment")
    segments = parts.path.split("/")[1:]
    if len(segments) != 2 or not all(segments):
        raise bad("the path must be /DATABASE/TABLE (both present, nothing after the table)")
    database, table = unquote(segments[0]), segments[1]
    names = table.split(".")
    if len(names) > 2 or not all(_IDENT.match(n) for n in names):
        raise bad(f"the table {table!r} must be NAME or SCHEMA.NAME (letters, digits, _ and $, not starting with a digit)")
    password = unquote(parts.password) if parts.password is not None else None
    user = parts.username
    host = parts.hostname or ""
    if host and ":" in host:  # IPv6
        host = f"[{host}]"
    netloc = (f"{user}@" if user else "") + host + (f":{port}" if port is not None else "")
    url = _join(parts.scheme, netloc, "/" + quote(database, safe=""), parts.query)
    return PostgresTarget(url=url, table=table, password=password)


# --- Spark types -> PostgreSQL types ------------------------------------------------------

def pg_type(dt: "DataType") -> str:
    """The PostgreSQL column type for a Spark type.

    Numbers map to their exact counterparts, ``timestamp`` to ``timestamptz``, ``timestamp_ntz``
    to ``timestamp``, arrays of scalars to arrays, structs, maps and nested arrays to ``jsonb``.

    >>> from pyspark.sql.types import DecimalType, MapType, StringType, IntegerType
    >>> pg_type(DecimalType(10, 2)), pg_type(MapType(StringType(), IntegerType()))
    ('numeric(10,2)', 'jsonb')
    """
    from pyspark.sql import types as T

    scalar = _scalar_pg_type(dt)
    if scalar is not None:
        return scalar
    if isinstance(dt, T.ArrayType):
        elem = _scalar_pg_type(dt.elementType)
        return f"{elem}[]" if elem is not None else "jsonb"
    if isinstance(dt, (T.StructType, T.MapType)):
        return "jsonb"
    raise SinkError(f"postgres sink: no PostgreSQL type for Spark type {dt.simpleString()}; cast the column"
                    " to a supported type (numbers, string, boolean, binary, date, timestamp, interval day"
                    " to second, arrays, structs, maps)")


def _scalar_pg_type(dt: "DataType") -> str | None:
    from pyspark.sql import types as T

    simple: list[tuple[type, str]] = [
        (T.BooleanType, "boolean"), (T.ByteType, "smallint"), (T.ShortType, "smallint"),
        (T.IntegerType, "integer"), (T.LongType, "bigint"), (T.FloatType, "real"),
        (T.DoubleType, "double precision"), (T.StringType, "text"), (T.BinaryType, "bytea"),
        (T.DateType, "date"), (T.TimestampNTZType, "timestamp"), (T.TimestampType, "timestamptz"),
        (T.DayTimeIntervalType, "interval"), (T.NullType, "text"),
    ]
    for cls, name in simple:
        if type(dt) is cls or (cls is T.StringType and isinstance(dt, T.StringType)):
            return name
    if isinstance(dt, T.DecimalType):
        return f"numeric({dt.precision},{dt.scale})"
    return None


# COPY needs the types by their catalog names (no modifiers).
_COPY_NAMES = {"boolean": "bool", "smallint": "int2", "integer": "int4", "bigint": "int8", "real": "float4",
               "double precision": "float8"}


def _copy_type(pg: str) -> str:
    array = pg.endswith("[]")
    base = pg[:-2] if array else pg
    base = _COPY_NAMES.get(base, base.split("(")[0])
    return base + ("[]" if array else "")


def _jsonable(value: Any, dt: "DataType") -> Any:
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(dt, T.StructType):
        return {f.name: _jsonable(value.get(f.name), f.dataType) for f in dt.fields}
    if isinstance(dt, T.MapType):
        items = value.items() if isinstance(value, dict) else value  # Arrow gives a list of pairs
        return {str(_jsonable(k, dt.keyType)): _jsonable(v, dt.valueType) for k, v in items}
    if isinstance(dt, T.ArrayType):
        return [_jsonable(v, dt.elementType) for v in value]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, str):
        return _no_nul(value)
    return value


#: What a NUL character (U+0000) becomes in PostgreSQL ``text`` and ``jsonb``, which cannot hold it.
NUL_REPLACEMENT = "\ufffd"


def _no_nul(text: str) -> str:
    return text.replace("\x00", NUL_REPLACEMENT) if "\x00" in text else text


def _converter(dt: "DataType", pg: str) -> Callable[[Any], Any] | None:
    """How a value from Arrow becomes a COPY value: NULs out of text, JSON for ``jsonb``; ``None``: as is."""
    if pg == "text":
        return lambda v: None if v is None else _no_nul(v)
    if pg == "text[]":
        return lambda v: None if v is None else [None if x is None else _no_nul(x) for x in v]
    if pg != "jsonb":
        return None
    from psycopg.types.json import Jsonb

    return lambda v: None if v is None else Jsonb(_jsonable(v, dt))


# --- connections ---------------------------------------------------------------------------

def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise SinkError(f"the postgres sink needs psycopg 3, which is not installed: {INSTALL_HINT}") from None
    return psycopg


def _password(target: PostgresTarget) -> str | None:
    if target.password is not None:
        return target.password
    path = os.environ.get(PASSWORD_FILE_ENV)
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.readline().rstrip("\r\n")
        except OSError as exc:
            raise SinkError(f"postgres sink: cannot read the password file {PASSWORD_FILE_ENV}={path!r}:"
                            f" {exc.strerror}") from None
    return None  # libpq: PGPASSWORD, PGPASSFILE, ~/.pgpass


class _Masked:
    """Turn any exception raised inside into a SinkError with the password masked."""

    def __init__(self, target: PostgresTarget, password: str | None, what: str) -> None:
        self.target, self.password, self.what = target, password, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None or isinstance(exc, SinkError) or not isinstance(exc, Exception):
            return False
        text = mask_url(str(exc).strip(), self.password)
        err = SinkError(f"postgres sink {self.target.display}: {self.what} failed:"
                        f" {type(exc).__name__}: {text}")
        leaks = self.password is not None and self.password != "" and self.password in str(exc)
        # The original exception is chained only when its text holds no password.
        raise err from (None if leaks else exc)


def connect(target: PostgresTarget, *, what: str = "connecting"):
    """A psycopg connection (not autocommit) to ``target``, errors masked.

    >>> target = parse_postgres_url("postgresql://app@localhost:5432/shop/sessions")
    >>> with connect(target) as conn:                                   # doctest: +SKIP
    ...     conn.execute("SELECT count(*) FROM sessions").fetchone()
    """
    psycopg = _psycopg()
    password = _password(target)
    with _Masked(target, password, what):
        kwargs = {"password": password} if password is not None else {}
        return psycopg.connect(target.url, connect_timeout=10, **kwargs)


# --- the writer ----------------------------------------------------------------------------

class PostgresBatchWriter:
    """The ``foreachBatch`` function of the postgres sink: ``writer(batch_df, batch_id)``.

    ``sink_id`` names this stream in the progress table; by default ``TABLE@QUERY_ID`` of the
    streaming query that calls the writer. Call :meth:`prepare` with the stream's schema before
    the query starts: it checks the connection and creates the tables if missing.

    >>> writer = PostgresBatchWriter(parse_postgres_url("postgresql://app@db/shop/sessions"))
    >>> writer.prepare(sessions.schema)                                # doctest: +SKIP
    >>> query = sessions.writeStream.foreachBatch(writer).start()      # doctest: +SKIP
    """

    def __init__(self, target: PostgresTarget, *, sink_id: str | None = None, checkpoint: str | None = None) -> None:
        self.target = target
        self.sink_id = sink_id
        self.checkpoint = checkpoint  # where the query id is read over Spark Connect
        self._prepared_for: "StructType | None" = None

    def __repr__(self) -> str:
        return f"PostgresBatchWriter({self.target.display!r}, sink_id={self.sink_id!r})"

    # SQL pieces ---------------------------------------------------------------------------
    def _table_sql(self):
        from psycopg import sql

        return sql.Identifier(*self.target.table.split("."))

    def _progress_sql(self):
        from psycopg import sql

        schema = self.target.schema_name
        return sql.Identifier(schema, PROGRESS_TABLE) if schema else sql.Identifier(PROGRESS_TABLE)

    def create_table_sql(self, schema: "StructType") -> str:
        """The ``CREATE TABLE IF NOT EXISTS`` statement for ``schema`` (as text).

        >>> from pyspark.sql.types import StructType, StructField, StringType, LongType
        >>> w = PostgresBatchWriter(parse_postgres_url("postgresql://h/db/public.s"))
        >>> print(w.create_table_sql(StructType([StructField("user_id", StringType(), False),
        ...                                      StructField("n", LongType())])))
        CREATE TABLE IF NOT EXISTS "public"."s" ("user_id" text NOT NULL, "n" bigint)
        """
        from psycopg import sql

        cols = [
            sql.SQL("{} {}{}").format(sql.Identifier(f.name), sql.SQL(pg_type(f.dataType)),
                                      sql.SQL("" if f.nullable else " NOT NULL"))
            for f in schema.fields
        ]
        stmt = sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(self._table_sql(), sql.SQL(", ").join(cols))
        return stmt.as_string(None)

    def _progress_ddl(self) -> str:
        from psycopg import sql

        return sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, batch_id bigint NOT NULL,"
            " row_count bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (sink_id, batch_id))"
        ).format(self._progress_sql()).as_string(None)

    # set-up ------------------------------------------------------------------------------
    def prepare(self, schema: "StructType") -> None:
        """Connect, create the target and progress tables if missing, check the target's columns."""
        for f in schema.fields:
            pg_type(f.dataType)  # unsupported types fail here, before anything is created
        psycopg = _psycopg()
        with connect(self.target) as conn:
            password = _password(self.target)
            with _Masked(self.target, password, "creating the tables"):
                for ddl in (self.create_table_sql(schema), self._progress_ddl()):
                    try:
                        with conn.transaction():
                            conn.execute(ddl)
                    except psycopg.errors.UniqueViolation:  # created concurrently by another writer
                        pass
                missing = self._missing_columns(conn, schema)
        if missing:
            raise SinkError(
                f"postgres sink {self.target.display}: the table exists but lacks the columns {missing} of"
                f" the stream (its columns: {schema.fieldNames()}); add them (ALTER TABLE ... ADD COLUMN) or"
                " write to another table")
        self._prepared_for = schema
        log.info("postgres sink %s: ready", self.target.display)

    def _missing_columns(self, conn: Any, schema: "StructType") -> list[str]:
        rows = conn.execute(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0"
            " AND NOT a.attisdropped",
            (self._table_sql().as_string(conn),),
        ).fetchall()
        have = {r[0] for r in rows}
        return [f.name for f in schema.fields if f.name not in have]

    # one micro-batch ---------------------------------------------------------------------
    def _sink_id(self, batch_df: "DataFrame") -> str:
        if self.sink_id is not None:
            return self.sink_id
        query_id = batch_query_id(batch_df, f"postgres sink {self.target.display}", "sink_id= to PostgresBatchWriter",
                                  self.checkpoint)
        return f"{self.target.table}@{query_id}"

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        """Write one micro-batch, or skip it if ``(sink id, batch_id)`` is already committed."""
        sink_id = self._sink_id(batch_df)
        schema = batch_df.schema
        if self._prepared_for != schema:
            self.prepare(schema)
        table = collect_arrow(batch_df)
        if table.num_rows == 0:
            log.debug("postgres sink %s: batch %d is empty", self.target.display, batch_id)
            return
        written = self.write_arrow(table, schema, sink_id, batch_id)
        if written is None:
            log.info("postgres sink %s: batch %d of %s was already committed; skipped (replay)",
                     self.target.display, batch_id, sink_id)
        else:
            log.info("postgres sink %s: batch %d: %d rows committed", self.target.display, batch_id, written)

    def write_arrow(self, table: Any, schema: "StructType", sink_id: str, batch_id: int) -> int | None:
        """Insert the rows of an Arrow table and the batch id in one transaction.

        Returns the number of rows written, or ``None`` when the batch was already committed.
        """
        from psycopg import sql

        pg_types = [pg_type(f.dataType) for f in schema.fields]
        converters = [_converter(f.dataType, t) for f, t in zip(schema.fields, pg_types)]
        names = schema.fieldNames()
        copy_stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(
            self._table_sql(), sql.SQL(", ").join(sql.Identifier(n) for n in names))
        claim = sql.SQL(
            "INSERT INTO {} (sink_id, batch_id, row_count) VALUES (%s, %s, %s)"
            " ON CONFLICT (sink_id, batch_id) DO NOTHING RETURNING batch_id").format(self._progress_sql())
        password = _password(self.target)
        with connect(self.target, what=f"writing batch {batch_id}") as conn:
            with _Masked(self.target, password, f"writing batch {batch_id}"):
                with conn.transaction() as tx:
                    if conn.execute(claim, (sink_id, batch_id, table.num_rows)).fetchone() is None:
                        tx.force_rollback = True  # nothing was written; leave no trace
                        return None
                    with conn.cursor() as cur, cur.copy(copy_stmt) as copy:
                        copy.set_types([_copy_type(t) for t in pg_types])
                        for record_batch in table.to_batches():
                            columns = [record_batch.column(i).to_pylist() for i in range(len(names))]
                            for i, conv in enumerate(converters):
                                if conv is not None:
                                    columns[i] = [conv(v) for v in columns[i]]
                            for row in zip(*columns):
                                copy.write_row(row)
                return table.num_rows


__all__ = ["PROGRESS_TABLE", "PASSWORD_FILE_ENV", "PostgresBatchWriter", "PostgresTarget", "connect", "mask_url",
           "parse_postgres_url", "pg_type"]
