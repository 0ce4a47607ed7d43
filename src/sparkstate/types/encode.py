"""Encoding: a Python value -> the external form PySpark accepts for a Spark type.

Encoders are compiled once per type into a closure; a value that does not fit raises
:class:`~sparkstate.errors.StateTypeError` naming where it is (``output.pages[2]``)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
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
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ..errors import StateTypeError
from .mapping import FRACTIONAL, INTEGRAL, row_class

#: each integral type's range (an int outside it is refused in words, not by Arrow on the way out)
_INT_RANGE: dict[type, tuple[int, int]] = {t: (-(2 ** (b - 1)), 2 ** (b - 1) - 1)
                                           for t, b in ((ByteType, 8), (ShortType, 16), (IntegerType, 32), (LongType, 64))}

#: Array element types whose values pass unchanged when of exactly these Python types.
_PLAIN_ELEMENTS: dict[type, frozenset] = {
    **{t: frozenset((int, type(None))) for t in INTEGRAL},
    StringType: frozenset((str, type(None))),
    BooleanType: frozenset((bool, type(None))),
}


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
    elif isinstance(dt, INTEGRAL):
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
    elif isinstance(dt, FRACTIONAL):
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
    **{t: frozenset((float, type(None))) for t in FRACTIONAL},
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
    as_float = isinstance(dt, FRACTIONAL)

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
