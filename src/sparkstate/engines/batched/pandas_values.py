"""The batched engine's fallback input path: the pandas columns PySpark hands a
``transformWithStateInPandas`` processor, turned back into the values the Row API gives.

Used only when the input is not packed (see ``engines/batched/engine.py``: an event-time input whose
late rows Spark must drop, or ``BatchedEngine(pack=False)``). PySpark's pandas round trip loses two things put back here:
integers with nulls arrive as floats with NaN, timestamps arrive naive in the session time
zone. Longs travel as strings (a long column with a null would arrive as float64 and lose every
digit past 2**53). One loss cannot be undone: a floating-point NaN and a null both arrive as
NaN; both become ``None``.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Callable

from pyspark.sql.types import (
    ArrayType, BinaryType, BooleanType, ByteType, DataType, DateType, DoubleType, FloatType, IntegerType,
    LongType, MapType, ShortType, StringType, StructType, TimestampNTZType, TimestampType,
)

from ..row_values import nested_converter
from ..runtime import arrow_type

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


def _cell(dt: DataType, tz: _dt.tzinfo) -> Cell:
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
    nested = nested_converter(dt, lambda t: _cell(t, tz))
    if nested is not None:
        return nested
    return lambda v: None if _is_null(v) else v


def pandas_column_converter(dt: DataType, tz: _dt.tzinfo) -> Callable[[Any], list]:
    """A function turning a pandas Series of Spark type ``dt`` into a list of Row-API values."""
    cell = _cell(dt, tz)
    flat_ok = isinstance(dt, (ByteType, ShortType, IntegerType, DoubleType, FloatType, BooleanType))

    plain = not isinstance(dt, (TimestampType, TimestampNTZType, DateType, BinaryType, ArrayType, MapType, StructType,
                                DoubleType, FloatType, *_INTEGRAL, BooleanType))
    integral = isinstance(dt, _INTEGRAL)
    # naive UTC timestamps without nulls: made aware in one vectorized step (the session time
    # zone sparkstate sets; another zone goes cell by cell, where DST folds are decided as before)
    utc_stamps = isinstance(dt, TimestampType) and tz is _dt.timezone.utc

    def convert(series: Any) -> list:
        kind = series.dtype.kind
        if flat_ok and kind in "iub":
            return series.tolist()
        if utc_stamps and kind == "M" and series.dt.tz is None and not series.isna().any():
            import pandas as pd

            return pd.DatetimeIndex(series).tz_localize(_dt.timezone.utc).to_pydatetime().tolist()
        if kind in "fO" and (plain or integral or kind == "f") and not series.isna().any():
            values = series.tolist()
            # no null: strings and decimals are ready; longs came as strings, other integers maybe as floats
            return list(map(int, values)) if integral else values
        return [cell(x) for x in series.tolist()]

    return convert


def zone(name: str) -> _dt.tzinfo:
    """The session time zone PySpark's naive pandas timestamps are in."""
    if name.upper() in ("UTC", "Z", "GMT", "ETC/UTC"):
        return _dt.timezone.utc
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(name)
    except Exception:
        return _dt.timezone.utc


def arrow_column(series: Any, dt: DataType, tz: _dt.tzinfo, convert: Callable[[Any], list]) -> Any:
    """A pandas Series of Spark type ``dt`` as the Arrow array Spark would have sent (timestamps
    as UTC instants). ``convert``: its :func:`pandas_column_converter`, for the columns without a
    vectorized way back."""
    import pyarrow as pa

    kind = series.dtype.kind
    if isinstance(dt, TimestampType) and kind == "M" and tz is _dt.timezone.utc and series.dt.tz is None:
        return pa.Array.from_pandas(series).cast(pa.timestamp("us", tz="UTC"), safe=False)
    if isinstance(dt, BooleanType) and kind == "b":
        return pa.array(series.to_numpy())
    if isinstance(dt, StringType) and kind == "O":
        return pa.Array.from_pandas(series, type=pa.string())
    return pa.array(convert(series), type=arrow_type(dt))
