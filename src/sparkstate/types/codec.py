"""Codecs: a state type with its Spark columns, encoder and decoder; schemas given as a dataclass,
a ``StructType`` or DDL; input rows rebuilt as ``value_type`` dataclasses."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

from pyspark.sql.types import (
    DataType,
    StructField,
    StructType,
)

from ..ddl import NoSparkError, parse_ddl
from ..errors import StateTypeError
from .decode import dataclass_decoder, decoder_for, first_column, identity
from .encode import encoder_for
from .mapping import PRIMITIVES, compatible, is_dataclass_type, is_primitive, spark_type_of, unwrap_optional

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
            encs = tuple(encoder_for(f.dataType, f"state_type.{f.name}") for f in self.columns.fields)
            if len(encs) == 1:
                (e0,) = encs
                return (lambda v: (e0(get(v)),) if type(v) is cls else tuple(enc(v))), dec
            return (lambda v: tuple([e(x) for e, x in zip(encs, get(v))]) if type(v) is cls else tuple(enc(v))), dec
        return (lambda v: (enc(v),)), (first_column if dec is identity else (lambda cols: dec(cols[0])))

    @staticmethod
    def of(tp: Any, where: str = "state_type") -> "Codec":
        """Build the codec of a dataclass, primitive, list or dict type."""
        inner, _ = unwrap_optional(tp, where)
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
    if is_primitive(spec):
        raise StateTypeError(
            f"{where}: expected a dataclass, a StructType or a DDL string of columns, got {spec.__name__};"
            f" for a single column write e.g. 'value {PRIMITIVES[spec].simpleString()}'"
        )
    raise StateTypeError(f"{where}: expected a dataclass, a StructType or a DDL string, got {spec!r}")



def record_decoder(value_type: Any, schema: StructType, where: str = "value_type") -> Callable[[Any], Any]:
    """Rebuild ``value_type`` dataclasses from input rows of ``schema``, checking fields now.

    Fields are looked up by name; columns the dataclass does not declare are ignored.
    """
    if not is_dataclass_type(value_type):
        raise StateTypeError(f"{where}: expected a dataclass, got {value_type!r}")
    declared = spark_type_of(value_type, where)
    if not isinstance(declared, StructType):  # a dataclass maps to a struct
        raise StateTypeError(f"{where}: {value_type!r} does not map to a struct")
    have = {f.name: (i, f.dataType) for i, f in enumerate(schema.fields)}
    problems = []
    positions = []
    for f in declared.fields:
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
    dec = dataclass_decoder(value_type)
    pos = tuple(positions)
    return lambda row: dec([row[i] for i in pos])
