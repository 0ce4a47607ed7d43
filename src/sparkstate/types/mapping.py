"""Python types -> Spark types: dataclasses, primitives, ``Optional``, containers; and which
Spark column types can feed a declared one."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import types as _pytypes
import typing
from typing import Any

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

from ..errors import StateTypeError

PRIMITIVES: dict[type, DataType] = {
    bool: BooleanType(),
    int: LongType(),
    float: DoubleType(),
    str: StringType(),
    bytes: BinaryType(),
    _dt.datetime: TimestampType(),
    _dt.date: DateType(),
    decimal.Decimal: DecimalType(38, 18),
}

INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
FRACTIONAL = (FloatType, DoubleType)

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


def unwrap_optional(tp: Any, where: str = "type") -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is getattr(_pytypes, "UnionType", None):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
        raise StateTypeError(
            f"{where}: unions other than Optional[T] cannot be stored; got {tp!r}. Use one type, or a dataclass"
        )
    return tp, False


def is_primitive(tp: Any) -> bool:
    try:
        return tp in PRIMITIVES
    except TypeError:  # unhashable, e.g. a list instance passed where a type belongs
        return False


def field_hints(cls: type) -> dict[str, Any]:
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
    tp, _ = unwrap_optional(tp, where)
    if isinstance(tp, DataType):
        return tp
    if is_primitive(tp):
        return PRIMITIVES[tp]
    if is_dataclass_type(tp):
        hints = field_hints(tp)
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



def compatible(declared: DataType, actual: DataType) -> bool:
    """Whether a column of Spark type ``actual`` can feed a field declared as ``declared``."""
    if isinstance(declared, INTEGRAL) and isinstance(actual, INTEGRAL):
        return True
    if isinstance(declared, FRACTIONAL) and isinstance(actual, INTEGRAL + FRACTIONAL):
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
