"""Turn the pandas columns PySpark hands a ``transformWithStateInPandas`` processor back into the
Python values the Row API would give (what the user's function sees under every engine).

The conversion is per column, and vectorized where the column is flat: a column of strings
or of non-null numbers costs one ``tolist()``. PySpark's pandas round trip loses two things
we put back: integers with nulls arrive as floats with NaN, timestamps arrive naive in the
session time zone. Longs travel as strings (a long column with a null would arrive as float64
and lose every digit past 2**53). One loss cannot be undone: a floating-point NaN and a null
both arrive as NaN; both become ``None``.

Structs reach the function as ``Row``s and maps as ``dict``s, as ``DataFrame.collect()`` gives
them, under every engine (:func:`row_fixer` does it for the Row API, which hands out dicts
and lists of pairs).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Callable

from pyspark.sql import Row

from ..types import row_class
from pyspark.sql.types import (
    ArrayType, BinaryType, BooleanType, ByteType, DataType, DateType, DoubleType, FloatType, IntegerType,
    LongType, MapType, ShortType, StructType, TimestampNTZType, TimestampType,
)

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
try:
    from pandas import NA as _NA
except ImportError:  # pragma: no cover - pandas is a core dependency
    _NA = None

Cell = Callable[[Any], Any]


def _is_null(v: Any) -> bool:
    if v is None or v is _NA:
        return True
    try:
        return v != v  # NaN, NaT
    except (TypeError, ValueError):
        return False


def make_row(names: list[str], values: Any) -> Row:
    """A Row with field names, as the Row API builds them (without the per-call Row factory)."""
    return tuple.__new__(row_class(names), values)


def cell_converter(dt: DataType, tz: _dt.tzinfo) -> Cell:
    """A function turning one pandas cell of Spark type ``dt`` into the Row API's value."""
    if isinstance(dt, _INTEGRAL):
        return lambda v: None if v is None or v is _NA or (isinstance(v, float) and v != v) else int(v)
    if isinstance(dt, (DoubleType, FloatType)):
        return lambda v: None if _is_null(v) else float(v)
    if isinstance(dt, BooleanType):
        return lambda v: None if _is_null(v) else bool(v)
    if isinstance(dt, TimestampType):
        def ts(v: Any) -> Any:
            if _is_null(v):
                return None
            if hasattr(v, "to_pydatetime"):
                v = v.to_pydatetime()
            if v.tzinfo is None:
                v = v.replace(tzinfo=tz)
            return v.astimezone(_dt.timezone.utc)
        return ts
    if isinstance(dt, TimestampNTZType):
        def ntz(v: Any) -> Any:
            if _is_null(v):
                return None
            return v.to_pydatetime() if hasattr(v, "to_pydatetime") else v
        return ntz
    if isinstance(dt, DateType):
        def date(v: Any) -> Any:
            if _is_null(v):
                return None
            return v.date() if isinstance(v, _dt.datetime) else v
        return date
    if isinstance(dt, BinaryType):
        return lambda v: None if v is None else bytes(v)
    if isinstance(dt, ArrayType):
        elem = cell_converter(dt.elementType, tz)
        return lambda v: None if v is None else [elem(x) for x in v]
    if isinstance(dt, MapType):
        kc, vc = cell_converter(dt.keyType, tz), cell_converter(dt.valueType, tz)

        def mapping(v: Any) -> Any:
            if v is None:
                return None
            items = v.items() if isinstance(v, dict) else v
            return {kc(k): vc(x) for k, x in items}
        return mapping
    if isinstance(dt, StructType):
        names = list(dt.names)
        convs = [cell_converter(f.dataType, tz) for f in dt.fields]

        def struct(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, dict):
                vals = [v.get(n) for n in names]
            else:
                vals = list(v)
            return make_row(names, [c(x) for c, x in zip(convs, vals)])
        return struct
    return lambda v: None if _is_null(v) else v


def column_converter(dt: DataType, tz: _dt.tzinfo) -> Callable[[Any], list]:
    """A function turning a pandas Series of Spark type ``dt`` into a list of Row-API values."""
    cell = cell_converter(dt, tz)
    flat_ok = isinstance(dt, (ByteType, ShortType, IntegerType, DoubleType, FloatType, BooleanType))

    plain = not isinstance(dt, (TimestampType, TimestampNTZType, DateType, BinaryType, ArrayType, MapType, StructType,
                                DoubleType, FloatType, *_INTEGRAL, BooleanType))
    integral = isinstance(dt, _INTEGRAL)

    def convert(series: Any) -> list:
        kind = series.dtype.kind
        if flat_ok and kind in "iub":
            return series.tolist()
        if kind in "fO" and (plain or integral or kind == "f") and not series.isna().any():
            values = series.tolist()
            # no null: strings and decimals are ready; longs came as strings, other integers maybe as floats
            return list(map(int, values)) if integral else values
        return [cell(x) for x in series.tolist()]

    return convert


def has_nested_records(dt: DataType) -> bool:
    """Whether a type holds a struct or a map anywhere (the Row API hands those out raw)."""
    if isinstance(dt, (StructType, MapType)):
        return True
    if isinstance(dt, ArrayType):
        return has_nested_records(dt.elementType)
    return False


def row_fixer(schema: StructType) -> Callable[[Any], Any] | None:
    """For the Row API: a function giving struct cells as Rows and map cells as dicts, or None
    when the schema has neither (then rows pass untouched)."""
    fix = [(i, cell_converter(f.dataType, _dt.timezone.utc)) for i, f in enumerate(schema.fields)
           if has_nested_records(f.dataType)]
    if not fix:
        return None
    names = list(schema.names)

    def fixed(row: Any) -> Any:
        vals = list(row)
        for i, conv in fix:
            vals[i] = conv(vals[i])
        return make_row(names, vals)

    return fixed
