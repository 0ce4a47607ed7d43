"""Type tags: a Spark type as a short string, read back without Spark (the tws layout's state rows
carry one for a state field whose type may change)."""

from __future__ import annotations

import re
from typing import Callable

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

from ...errors import StateTypeError

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


def parse_struct_tag(tag: str) -> StructType:
    """:func:`parse_type_tag` of a stored state's tag, which is a struct's."""
    t = parse_type_tag(tag)
    if not isinstance(t, StructType):
        raise StateTypeError(f"stored state type {tag!r} is not a struct")
    return t


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
