"""Python types <-> Spark types, and the codecs that move values between them.

Encoding is driven by the Spark type: a struct accepts a dataclass instance, a dict, a
``Row`` or a tuple; an array a list; a map a dict. Decoding is driven by the Python type:
dataclasses are rebuilt positionally, and a stored null in a field that is not ``Optional``
takes the field's default (this is how a state written before a field was added reads back).

Timestamps come back as UTC-aware ``datetime`` objects, as input rows do.

Every encoder and decoder is compiled once per type into a closure, so the per-value cost
is a few attribute reads, not a walk over type annotations.

>>> from dataclasses import dataclass
>>> @dataclass
... class Visit:
...     user: str
...     pages: list[str]
...     count: int = 0
>>> spark_type_of(Visit).simpleString()
'struct<user:string,pages:array<string>,count:bigint>'
>>> codec = Codec.of(Visit)
>>> codec.decode(codec.encode(Visit("a", ["p1"], 2)))
Visit(user='a', pages=['p1'], count=2)
>>> codec.decode(("a", ["p1"], None))   # a row written before `count` existed
Visit(user='a', pages=['p1'], count=0)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import operator
import re
import types as _pytypes
import typing
from dataclasses import dataclass
from typing import Any, Callable

from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from .ddl import NoSparkError, parse_ddl
from .errors import StateTypeError

_PRIMITIVES: dict[type, DataType] = {
    bool: BooleanType(),
    int: LongType(),
    float: DoubleType(),
    str: StringType(),
    bytes: BinaryType(),
    _dt.datetime: TimestampType(),
    _dt.date: DateType(),
    decimal.Decimal: DecimalType(38, 18),
}

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
#: each integral type's range (an int outside it is refused in words, not by Arrow on the way out)
_INT_RANGE: dict[type, tuple[int, int]] = {t: (-(2 ** (b - 1)), 2 ** (b - 1) - 1)
                                           for t, b in ((ByteType, 8), (ShortType, 16), (IntegerType, 32), (LongType, 64))}
_FRACTIONAL = (FloatType, DoubleType)

#: Array element types whose values pass unchanged when of exactly these Python types.
_PLAIN_ELEMENTS: dict[type, frozenset] = {
    **{t: frozenset((int, type(None))) for t in _INTEGRAL},
    StringType: frozenset((str, type(None))),
    BooleanType: frozenset((bool, type(None))),
}

_ROW_CLASSES: dict[tuple[str, ...], type] = {}


def row_class(names: Any) -> type:
    """A ``Row`` subclass whose field names live on the class, so ``row_class(n)(*values)`` builds
    a Row without a per-row attribute write. Its rows are ordinary Rows to everything else
    (``isinstance``, ``asDict``, attribute access, pickling, Spark's converters, and PySpark's
    state-value normalizer, which rebuilds a Row as ``type(row)(*values)``).

    >>> r = row_class(("a", "b"))(1, 2)
    >>> r, r.b, r.asDict(), isinstance(r, Row), type(r)(*r) == r
    (Row(a=1, b=2), 2, {'a': 1, 'b': 2}, True, True)
    """
    key = tuple(names)
    cls = _ROW_CLASSES.get(key)
    if cls is None:
        fields = list(key)
        cls = type("Row", (Row,), {"__fields__": fields, "__new__": lambda c, *vals: tuple.__new__(c, vals)})
        _ROW_CLASSES[key] = cls
    return cls


def _unwrap_optional(tp: Any, where: str = "type") -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is getattr(_pytypes, "UnionType", None):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
        raise StateTypeError(
            f"{where}: unions other than Optional[T] cannot be stored; got {tp!r}. Use one type, or a dataclass"
        )
    return tp, False


def _is_primitive(tp: Any) -> bool:
    try:
        return tp in _PRIMITIVES
    except TypeError:  # unhashable, e.g. a list instance passed where a type belongs
        return False


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:  # forward refs that do not resolve
        raise StateTypeError(
            f"cannot read the type annotations of dataclass {cls.__name__}: {exc}."
            " Define the dataclass at module level with importable annotations."
        ) from exc


def is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def spark_type_of(tp: Any, where: str = "type") -> DataType:
    """The Spark type for a Python type annotation; raises ``StateTypeError`` naming ``where``.

    >>> spark_type_of(dict[str, list[int]]).simpleString()
    'map<string,array<bigint>>'
    """
    tp, _ = _unwrap_optional(tp, where)
    if isinstance(tp, DataType):
        return tp
    if _is_primitive(tp):
        return _PRIMITIVES[tp]
    if is_dataclass_type(tp):
        hints = _hints(tp)
        return StructType(
            [
                StructField(f.name, spark_type_of(hints[f.name], f"{where}.{f.name}"), True)
                for f in dataclasses.fields(tp)
            ]
        )
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, typing.List, tuple) or tp is list or tp is tuple:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise StateTypeError(
                f"{where}: fixed-size tuples cannot be stored; use tuple[T, ...], list[T] or a dataclass"
            )
        if not args:
            raise StateTypeError(f"{where}: a bare {getattr(tp, '__name__', tp)} needs its element type, e.g. list[str]")
        return ArrayType(spark_type_of(args[0], f"{where}[]"), True)
    if origin is dict:
        if len(args) != 2:
            raise StateTypeError(f"{where}: dict needs key and value types, e.g. dict[str, int]")
        return MapType(spark_type_of(args[0], f"{where}.key"), spark_type_of(args[1], f"{where}.value"), True)
    if tp is dict:
        raise StateTypeError(f"{where}: a bare dict needs key and value types, e.g. dict[str, int]")
    supported = "int, float, str, bool, bytes, datetime, date, Decimal, dataclasses, list[T], dict[K, V], Optional[T]"
    raise StateTypeError(f"{where}: type {tp!r} cannot be stored; supported: {supported}")


# ---------------------------------------------------------------------------------------------
# Encoding: Python value -> the external form PySpark accepts for a Spark type.
# ---------------------------------------------------------------------------------------------

def _type_error(where: str, expected: str, value: Any) -> StateTypeError:
    return StateTypeError(f"{where}: expected {expected}, got {type(value).__name__} {value!r}")


def _ints_in_range(values: list, has_none: bool, bounds: tuple[int, int] | None) -> bool:
    """Whether a list of ints (and Nones, when ``has_none``) fits ``bounds``; two C-level scans."""
    if bounds is None:
        return True
    if has_none:
        values = [v for v in values if v is not None]
    return not values or (bounds[0] <= min(values) and max(values) <= bounds[1])


def encoder_for(dt: DataType, where: str = "value") -> Callable[[Any], Any]:
    """A function turning a Python value into the external value for Spark type ``dt``."""
    if isinstance(dt, StructType):
        return _struct_encoder(dt, where)
    if isinstance(dt, ArrayType):
        elem = encoder_for(dt.elementType, f"{where}[]")
        plain = _PLAIN_ELEMENTS.get(type(dt.elementType))
        bounds = _INT_RANGE.get(type(dt.elementType))

        def enc_array(v: Any) -> Any:
            if v is None:
                return None
            # A list of plain ints / strs / bools needs no per-element call (one C-level type scan).
            if plain is not None and type(v) is list and plain.issuperset(map(type, v)) \
                    and _ints_in_range(v, True, bounds):
                return list(v)
            if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__iter__"):
                raise _type_error(where, "a list", v)
            return [elem(x) for x in v]

        return enc_array
    if isinstance(dt, MapType):
        kenc = encoder_for(dt.keyType, f"{where}.key")
        venc = encoder_for(dt.valueType, f"{where}.value")

        def enc_map(v: Any) -> Any:
            if v is None:
                return None
            if not isinstance(v, dict):
                raise _type_error(where, "a dict", v)
            return {kenc(k): venc(x) for k, x in v.items()}

        return enc_map
    return _primitive_encoder(dt, where)


def _primitive_encoder(dt: DataType, where: str) -> Callable[[Any], Any]:
    if isinstance(dt, BooleanType):
        ok: tuple[type, ...] = (bool,)
        name = "a bool"
    elif isinstance(dt, _INTEGRAL):
        lo, hi = _INT_RANGE[type(dt)]
        kind = dt.simpleString()

        def enc_int(v: Any) -> Any:
            if v is None:
                return v
            if isinstance(v, int) and not isinstance(v, bool):
                if lo <= v <= hi:
                    return v
                raise StateTypeError(f"{where}: {v} does not fit in {kind} ({lo} to {hi})")
            raise _type_error(where, "an int", v)
        return enc_int
    elif isinstance(dt, _FRACTIONAL):
        def enc_float(v: Any) -> Any:
            if v is None or isinstance(v, float):
                return v
            if isinstance(v, int) and not isinstance(v, bool):
                return float(v)
            raise _type_error(where, "a float", v)
        return enc_float
    elif isinstance(dt, StringType):
        ok, name = (str,), "a str"
    elif isinstance(dt, BinaryType):
        ok, name = (bytes, bytearray), "bytes"
    elif isinstance(dt, (TimestampType, TimestampNTZType)):
        ok, name = (_dt.datetime,), "a datetime"
    elif isinstance(dt, DateType):
        def enc_date(v: Any) -> Any:
            if v is None or (isinstance(v, _dt.date) and not isinstance(v, _dt.datetime)):
                return v
            raise _type_error(where, "a date", v)
        return enc_date
    elif isinstance(dt, DecimalType):
        ok, name = (decimal.Decimal, int), "a Decimal"
    else:
        return lambda v: v

    def enc(v: Any) -> Any:
        if v is None or isinstance(v, ok):
            return v
        raise _type_error(where, name, v)

    return enc


def _struct_encoder(st: StructType, where: str) -> Callable[[Any], Any]:
    names = tuple(st.names)
    encs = tuple(encoder_for(f.dataType, f"{where}.{f.name}") for f in st.fields)
    pairs = tuple(zip(names, encs))
    cls = row_class(names)
    new = tuple.__new__

    def make(values: list) -> Any:
        return new(cls, values)

    n = len(names)

    def enc_struct(v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, Row) and hasattr(v, "__fields__"):
            d = v.asDict()
            return make([e(_field(d, k, where)) for k, e in pairs])
        if isinstance(v, dict):
            return make([e(_field(v, k, where)) for k, e in pairs])
        if isinstance(v, (tuple, list)):
            if len(v) != n:
                raise StateTypeError(
                    f"{where}: expected {n} values ({', '.join(names)}), got a {type(v).__name__} of {len(v)}: {v!r}"
                )
            return make([e(x) for (_, e), x in zip(pairs, v)])
        if dataclasses.is_dataclass(v):
            try:
                return make([e(getattr(v, k)) for k, e in pairs])
            except AttributeError as exc:
                raise StateTypeError(
                    f"{where}: expected fields {', '.join(names)}; {type(v).__name__} has no {exc.name!r}"
                ) from None
        raise _type_error(where, f"a dataclass, dict, Row or tuple with fields {', '.join(names)}", v)

    return enc_struct


def _field(d: dict, k: str, where: str) -> Any:
    try:
        return d[k]
    except KeyError:
        raise StateTypeError(f"{where}: missing field {k!r}; got fields {', '.join(map(str, d))}") from None


class RowTypeError(StateTypeError):
    """A value at ``index`` of a list given to a :func:`columns_encoder` does not fit the type."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


#: Column types whose cells pass unchanged when every cell is of exactly one of these Python types.
_PLAIN_COLUMNS: dict[type, frozenset] = {
    **_PLAIN_ELEMENTS,
    **{t: frozenset((float, type(None))) for t in _FRACTIONAL},
    BinaryType: frozenset((bytes, type(None))),
    DateType: frozenset((_dt.date, type(None))),
}


def columns_encoder(st: StructType, where: str = "output") -> Callable[[list], list[list]]:
    """A function turning a list of records (tuples, Rows, dicts or dataclasses; what
    :func:`encoder_for` accepts for ``st``) into one list per field of ``st``, each cell encoded.

    The same values and errors as encoding record by record, but a list of plain tuples is
    transposed in one step and each column checked with one scan of its cells' types; cells are
    encoded one by one only in a column that scan cannot clear. A bad record raises
    :class:`RowTypeError` with its index.
    """
    names = tuple(st.names)
    n = len(names)
    row_enc = _struct_encoder(st, where)
    checks = tuple(_column_check(f.dataType, f"{where}.{f.name}") for f in st.fields)
    tuple_only = {tuple}

    def encode(records: list) -> list[list]:
        if not records:
            return [[] for _ in names]
        if set(map(type, records)) == tuple_only and set(map(len, records)) == {n}:
            cols = [list(c) for c in zip(*records)] if n else []
            return [check(col) for check, col in zip(checks, cols)]
        rows = _encode_each(row_enc, records)
        return [list(c) for c in zip(*rows)] if n else []

    return encode


def _encode_each(enc: Callable[[Any], Any], values: list) -> list:
    """``enc`` of each value; a value it refuses raises :class:`RowTypeError` with its index."""
    out = []
    for i, v in enumerate(values):
        try:
            out.append(enc(v))
        except StateTypeError as exc:
            raise RowTypeError(i, str(exc)) from None
    return out


def _column_check(dt: DataType, where: str) -> Callable[[list], list]:
    """A function encoding one column's cells (see :func:`columns_encoder`)."""
    enc = encoder_for(dt, where)
    plain = _PLAIN_COLUMNS.get(type(dt))
    as_float = isinstance(dt, _FRACTIONAL)

    def one_by_one(col: list) -> list:
        return _encode_each(enc, col)

    if plain is None:
        return one_by_one
    widened = plain | {int}
    bounds = _INT_RANGE.get(type(dt))
    none = type(None)

    def check(col: list) -> list:
        kinds = set(map(type, col))
        if kinds <= plain and _ints_in_range(col, none in kinds, bounds):
            return col
        if as_float and kinds <= widened:  # ints in a float column: converted, as encoder_for does
            return [float(v) if type(v) is int else v for v in col]
        return one_by_one(col)

    return check


# ---------------------------------------------------------------------------------------------
# Decoding: the external value Spark hands to Python -> the Python type.
# ---------------------------------------------------------------------------------------------

def _identity(v: Any) -> Any:
    return v


def _first(cols: Any) -> Any:
    return cols[0]


def decoder_for(tp: Any) -> Callable[[Any], Any]:
    """A function rebuilding a value of Python type ``tp`` from what Spark returns."""
    tp, _ = _unwrap_optional(tp)
    if is_dataclass_type(tp):
        return _dataclass_decoder(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, tuple):
        elem = decoder_for(args[0])
        conv = tuple if origin is tuple else list
        if elem is _identity and conv is list:
            return lambda v: None if v is None else list(v)
        return lambda v: None if v is None else conv(elem(x) for x in v)
    if origin is dict:
        kdec, vdec = decoder_for(args[0]), decoder_for(args[1])
        if kdec is _identity and vdec is _identity:
            return lambda v: None if v is None else dict(v)
        return lambda v: None if v is None else {kdec(k): vdec(x) for k, x in v.items()}
    if tp is float:
        return lambda v: None if v is None else float(v)
    if tp is _dt.datetime:
        return _to_utc
    return _identity


def _to_utc(v: Any) -> Any:
    # Input rows reach Python as UTC-aware datetimes, but state read back from the JVM is naive
    # (local time). Hand out one kind: aware, in UTC, so they compare with each other.
    if v is None:
        return None
    return v.astimezone(_dt.timezone.utc)


def _dataclass_decoder(cls: type) -> Callable[[Any], Any]:
    hints = _hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        inner, optional = _unwrap_optional(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default: Callable[[], Any] | None = (lambda d=f.default: d)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory  # type: ignore[misc]
        else:
            default = None
        plan.append((f.name, decoder_for(inner), None if optional else default, f.init))
    plan_t = tuple(plan)
    all_init = all(p[3] for p in plan_t)
    decs = tuple(p[1] for p in plan_t)
    defaults = tuple(p[2] for p in plan_t)
    names = [p[0] for p in plan_t]

    def dec(v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, dict):
            vals = [v.get(name) for name in names]
        elif isinstance(v, Row) and getattr(v, "__fields__", names) != names:
            # A struct whose fields are in another order (or has others): match by name.
            have = v.asDict()
            vals = [have.get(name) for name in names]
        else:
            vals = v
        out = [d(x) if x is not None else (default() if default is not None else None)
               for d, default, x in zip(decs, defaults, vals)]
        if all_init:
            return cls(*out)
        obj = cls(**{p[0]: x for p, x in zip(plan_t, out) if p[3]})
        for p, x in zip(plan_t, out):
            if not p[3]:
                object.__setattr__(obj, p[0], x)
        return obj

    return dec


# ---------------------------------------------------------------------------------------------
# Codecs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Codec:
    """A Python type with its Spark type, encoder and decoder.

    ``fields`` are the top-level column names this type occupies in a row: a dataclass
    spreads over its fields, anything else sits in one column called ``value``.
    """

    py_type: Any
    spark_type: DataType
    fields: tuple[str, ...]
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]

    @property
    def is_struct(self) -> bool:
        return isinstance(self.spark_type, StructType)

    @property
    def columns(self) -> StructType:
        """The columns this type takes in a flat row (dataclass fields, or ``value``)."""
        if isinstance(self.spark_type, StructType):
            return self.spark_type
        return StructType([StructField("value", self.spark_type, True)])

    def encode_columns(self, value: Any) -> tuple:
        """``value`` as a tuple of column values (see :attr:`columns`)."""
        enc = self.encode(value)
        return tuple(enc) if self.is_struct else (enc,)

    def decode_columns(self, cols: Any) -> Any:
        """Inverse of :meth:`encode_columns`."""
        return self.decode(cols) if self.is_struct else self.decode(cols[0])

    def columns_coders(self) -> tuple[Callable[[Any], tuple], Callable[[Any], Any]]:
        """:meth:`encode_columns` and :meth:`decode_columns` as two functions with the type's
        checks made once, for loops that call them per key."""
        enc, dec = self.encode, self.decode
        if self.is_struct:
            if not is_dataclass_type(self.py_type) or not self.fields:
                return (lambda v: tuple(enc(v))), dec
            # the state's own dataclass (the usual case): its fields read in one C call, each
            # checked by its field's encoder; any other value goes through the full encoder
            cls = self.py_type
            get = operator.attrgetter(*self.fields)
            encs = tuple(encoder_for(f.dataType, f"state_type.{f.name}") for f in self.spark_type.fields)
            if len(encs) == 1:
                (e0,) = encs
                return (lambda v: (e0(get(v)),) if type(v) is cls else tuple(enc(v))), dec
            return (lambda v: tuple([e(x) for e, x in zip(encs, get(v))]) if type(v) is cls else tuple(enc(v))), dec
        return (lambda v: (enc(v),)), (_first if dec is _identity else (lambda cols: dec(cols[0])))

    @staticmethod
    def of(tp: Any, where: str = "state_type") -> "Codec":
        """Build the codec of a dataclass, primitive, list or dict type."""
        inner, _ = _unwrap_optional(tp, where)
        st = spark_type_of(inner, where)
        fields = tuple(st.names) if isinstance(st, StructType) else ("value",)
        enc = encoder_for(st, where)
        return Codec(inner, st, fields, enc, decoder_for(inner))


def parse_schema(spec: Any, where: str = "output_type") -> StructType:
    """A ``StructType`` from a dataclass, a ``StructType`` or a DDL string.

    >>> @dataclass
    ... class WordCount:
    ...     word: str
    ...     count: int
    >>> parse_schema(WordCount).simpleString()
    'struct<word:string,count:bigint>'

    A DDL string such as ``"word string, count long"`` gives the same; it is parsed by Spark,
    so it needs a running SparkSession.
    """
    if isinstance(spec, StructType):
        return spec
    if is_dataclass_type(spec):
        return spark_type_of(spec, where)  # type: ignore[return-value]
    if isinstance(spec, str):
        try:
            parsed = parse_ddl(spec)
        except NoSparkError:
            raise StateTypeError(
                f"{where}: reading the DDL string {spec!r} needs a running SparkSession, and there is none."
                " Start one first (ss.spark_session()), or pass a dataclass or a StructType."
            ) from None
        except Exception as exc:
            raise StateTypeError(
                f"{where}: {spec!r} is not a valid DDL schema (e.g. 'word string, count long'): {exc}"
            ) from None
        if isinstance(parsed, StructType):
            return parsed
        raise StateTypeError(f"{where}: expected a list of columns such as 'word string, count long', got {spec!r}")
    if _is_primitive(spec):
        raise StateTypeError(
            f"{where}: expected a dataclass, a StructType or a DDL string of columns, got {spec.__name__};"
            f" for a single column write e.g. 'value {_PRIMITIVES[spec].simpleString()}'"
        )
    raise StateTypeError(f"{where}: expected a dataclass, a StructType or a DDL string, got {spec!r}")


def compatible(declared: DataType, actual: DataType) -> bool:
    """Whether a column of Spark type ``actual`` can feed a field declared as ``declared``."""
    if isinstance(declared, _INTEGRAL) and isinstance(actual, _INTEGRAL):
        return True
    if isinstance(declared, _FRACTIONAL) and isinstance(actual, _INTEGRAL + _FRACTIONAL):
        return True
    if isinstance(declared, TimestampType) and isinstance(actual, (TimestampType, TimestampNTZType)):
        return True
    if isinstance(declared, StructType) and isinstance(actual, StructType):
        have = {f.name: f.dataType for f in actual.fields}
        return all(f.name in have and compatible(f.dataType, have[f.name]) for f in declared.fields)
    if isinstance(declared, ArrayType) and isinstance(actual, ArrayType):
        return compatible(declared.elementType, actual.elementType)
    if isinstance(declared, MapType) and isinstance(actual, MapType):
        return compatible(declared.keyType, actual.keyType) and compatible(declared.valueType, actual.valueType)
    return type(declared) is type(actual) and (
        not isinstance(declared, DecimalType) or declared == actual  # type: ignore[comparison-overlap]
    )


def record_decoder(value_type: Any, schema: StructType, where: str = "value_type") -> Callable[[Any], Any]:
    """Rebuild ``value_type`` dataclasses from input rows of ``schema``, checking fields now.

    Fields are looked up by name; columns the dataclass does not declare are ignored.
    """
    if not is_dataclass_type(value_type):
        raise StateTypeError(f"{where}: expected a dataclass, got {value_type!r}")
    declared = spark_type_of(value_type, where)
    have = {f.name: (i, f.dataType) for i, f in enumerate(schema.fields)}
    problems = []
    positions = []
    for f in declared.fields:  # type: ignore[union-attr]
        if f.name not in have:
            problems.append(f"field {f.name!r} has no column (columns: {', '.join(schema.names)})")
            continue
        idx, actual = have[f.name]
        if not compatible(f.dataType, actual):
            problems.append(
                f"field {f.name!r} is {f.dataType.simpleString()} but the column is {actual.simpleString()}"
            )
        positions.append(idx)
    if problems:
        raise StateTypeError(f"{where} {value_type.__name__} does not match the input: " + "; ".join(problems))
    dec = _dataclass_decoder(value_type)
    pos = tuple(positions)
    return lambda row: dec([row[i] for i in pos])


# ---------------------------------------------------------------------------------------------
# Type tags: a Spark type as a short string, read back without Spark (state rows carry one)
# ---------------------------------------------------------------------------------------------

_ATOMIC_TAGS: dict[str, Callable[[], DataType]] = {
    "boolean": BooleanType, "tinyint": ByteType, "smallint": ShortType, "int": IntegerType,
    "bigint": LongType, "float": FloatType, "double": DoubleType, "string": StringType,
    "binary": BinaryType, "date": DateType, "timestamp": TimestampType, "timestamp_ntz": TimestampNTZType,
}
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _tag_name(name: str) -> str:
    return name if _PLAIN_NAME.match(name) else "`" + name.replace("`", "``") + "`"


def type_tag(dt: DataType) -> str:
    """A Spark type as a short string (Spark's ``simpleString``, with odd field names quoted in
    backticks); :func:`parse_type_tag` reads it back, with no Spark needed.

    >>> type_tag(StructType([StructField("n", LongType()), StructField("a b", ArrayType(StringType()))]))
    'struct<n:bigint,`a b`:array<string>>'
    """
    if isinstance(dt, StructType):
        return "struct<" + ",".join(f"{_tag_name(f.name)}:{type_tag(f.dataType)}" for f in dt.fields) + ">"
    if isinstance(dt, ArrayType):
        return f"array<{type_tag(dt.elementType)}>"
    if isinstance(dt, MapType):
        return f"map<{type_tag(dt.keyType)},{type_tag(dt.valueType)}>"
    if isinstance(dt, DecimalType):
        return f"decimal({dt.precision},{dt.scale})"
    for tag, cls in _ATOMIC_TAGS.items():
        if type(dt) is cls:
            return tag
    raise StateTypeError(f"type {dt.simpleString()} cannot be stored in state")


def parse_type_tag(tag: str) -> DataType:
    """Inverse of :func:`type_tag` (every field nullable).

    >>> parse_type_tag('struct<n:bigint,`a b`:array<string>,m:map<string,decimal(38,18)>>').simpleString()
    'struct<n:bigint,a b:array<string>,m:map<string,decimal(38,18)>>'
    """
    dt, pos = _parse_tag(tag, 0)
    if pos != len(tag):
        raise ValueError(f"not a type tag: {tag!r} (stray text at {pos})")
    return dt


def tag_fields(tag: str) -> tuple[str, ...]:
    """The top-level field names of a struct type tag (the columns a state row holds)."""
    dt = parse_type_tag(tag)
    if not isinstance(dt, StructType):
        raise ValueError(f"not a struct type tag: {tag!r}")
    return tuple(dt.names)


def _parse_tag(s: str, i: int) -> tuple[DataType, int]:
    if s.startswith("struct<", i):
        i += 7
        fields = []
        while s[i] != ">":
            if s[i] == "`":
                j, name = i + 1, []
                while True:
                    if s[j] == "`" and s.startswith("``", j):
                        name.append("`")
                        j += 2
                    elif s[j] == "`":
                        break
                    else:
                        name.append(s[j])
                        j += 1
                fname, i = "".join(name), j + 1
            else:
                j = s.index(":", i)
                fname, i = s[i:j], j
            if s[i] != ":":
                raise ValueError(f"not a type tag: {s!r} (expected ':' at {i})")
            ftype, i = _parse_tag(s, i + 1)
            fields.append(StructField(fname, ftype, True))
            if s[i] == ",":
                i += 1
        return StructType(fields), i + 1
    if s.startswith("array<", i):
        elem, i = _parse_tag(s, i + 6)
        return ArrayType(elem, True), i + 1
    if s.startswith("map<", i):
        k, i = _parse_tag(s, i + 4)
        v, i = _parse_tag(s, i + 1)
        return MapType(k, v, True), i + 1
    if s.startswith("decimal(", i):
        j = s.index(")", i)
        p, sc = s[i + 8: j].split(",")
        return DecimalType(int(p), int(sc)), j + 1
    m = re.compile(r"[a-z_]+").match(s, i)
    if m is None or m.group(0) not in _ATOMIC_TAGS:
        raise ValueError(f"not a type tag: {s!r} (unknown type at {i})")
    return _ATOMIC_TAGS[m.group(0)](), m.end()
