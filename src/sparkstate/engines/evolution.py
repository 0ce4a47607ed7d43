"""Which changes to a state type keep the old state, and a field-by-field diff when one does not.

The rules are the same for every engine; what is stored is read through the engine that wrote
the checkpoint (:mod:`sparkstate.engines.checkpoint`). Used by the operators' ``checkpoint=``
check and by :mod:`sparkstate.state`.

Compatible (the old state is kept on restart): adding a field that has a default or is
``Optional`` (old rows read it as null and the decoder applies the default), removing a field,
widening a number (int -> long -> float -> double). Anything else (a field renamed or added
without a default, a narrowed or changed type, a different key) is refused before the query
starts, because Spark would either refuse it inside the first batch or hand the function nulls.

>>> from pyspark.sql.types import StructType, StructField, LongType, DoubleType, StringType
>>> old = StructType([StructField("n", LongType()), StructField("label", StringType())])
>>> new = StructType([StructField("n", DoubleType()), StructField("count", LongType())])
>>> for c in diff_schemas(old, new): print(c)
n: widened (bigint -> double)
count: added without a default (bigint)
label: removed (string)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructField,
    StructType,
)

from ..errors import StateSchemaError
from ..fs import FsUnavailable
from ..spark import is_connect
from ..types import is_dataclass_type
from .checkpoint import has_state, stored_layout
from .runtime import STATE_READERS, has, pyspark_minor

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .base import StoredLayout

_NUMERIC_ORDER = (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType)


@dataclass(frozen=True)
class FieldChange:
    """One difference between the stored and the new schema."""

    path: str
    change: str
    old: str | None
    new: str | None
    compatible: bool

    def __str__(self) -> str:
        if self.old and self.new:
            types = f"{self.old} -> {self.new}"
        else:
            types = self.old or self.new or ""
        return f"{self.path}: {self.change} ({types})"


def _rank(dt: DataType) -> int | None:
    for i, t in enumerate(_NUMERIC_ORDER):
        if isinstance(dt, t):
            return i
    return None


def _defaulted(tp: Any, prefix: str = "") -> set[str]:
    """Paths of dataclass fields that have a default or are Optional (recursively)."""
    out: set[str] = set()
    if not is_dataclass_type(tp):
        return out
    hints = typing.get_type_hints(tp)
    for f in dataclasses.fields(tp):
        path = f"{prefix}{f.name}"
        hint = hints[f.name]
        optional = type(None) in typing.get_args(hint)
        if optional or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out.add(path)
        inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        out |= _defaulted(inner[0], path + ".")
    return out


def diff_schemas(old: StructType, new: StructType, defaulted: set[str] | None = None, prefix: str = "") -> list[FieldChange]:
    """The field-level changes from ``old`` to ``new``; ``defaulted``: paths that have defaults."""
    defaulted = defaulted or set()
    changes: list[FieldChange] = []
    old_fields = {f.name: f for f in old.fields}
    new_names = set(new.names)
    for f in new.fields:
        path = f"{prefix}{f.name}"
        if f.name not in old_fields:
            ok = path in defaulted
            changes.append(FieldChange(path, "added" if ok else "added without a default", None,
                                       f.dataType.simpleString(), ok))
            continue
        changes.extend(_diff_type(path, old_fields[f.name].dataType, f.dataType, defaulted))
    for f in old.fields:
        if f.name not in new_names:
            changes.append(FieldChange(f"{prefix}{f.name}", "removed", f.dataType.simpleString(), None, True))
    return changes


def _diff_type(path: str, old: DataType, new: DataType, defaulted: set[str]) -> list[FieldChange]:
    if old == new:
        return []
    if isinstance(old, StructType) and isinstance(new, StructType):
        return diff_schemas(old, new, defaulted, path + ".")
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return _diff_type(path + "[]", old.elementType, new.elementType, defaulted)
    if isinstance(old, MapType) and isinstance(new, MapType):
        return (_diff_type(path + ".key", old.keyType, new.keyType, defaulted)
                + _diff_type(path + ".value", old.valueType, new.valueType, defaulted))
    ro, rn = _rank(old), _rank(new)
    o, n = old.simpleString(), new.simpleString()
    if ro is not None and rn is not None:
        if rn > ro:
            return [FieldChange(path, "widened", o, n, True)]
        return [FieldChange(path, "narrowed", o, n, False)]
    if o == n:  # same type, other nullability
        return []
    return [FieldChange(path, "type changed", o, n, False)]


def check_compatible(spark: "SparkSession", checkpoint: str | os.PathLike, key_schema: StructType,
                     state_schema: StructType, state_type: Any = None, engine: str | None = None) -> list[FieldChange]:
    """Compare the state stored in ``checkpoint`` with a query's key and state schemas.

    Returns the (compatible) changes; raises :class:`StateSchemaError` listing every field-level
    difference when one of them would lose or corrupt the old state. A checkpoint without
    committed state passes. ``engine``: the engine the query runs on; state written by another
    engine (another layout) is refused.
    """
    return inspect_checkpoint(spark, checkpoint, key_schema, state_schema, state_type, engine)[1]


def inspect_checkpoint(
    spark: "SparkSession",
    checkpoint: str | os.PathLike,
    key_schema: StructType,
    state_schema: StructType,
    state_type: Any = None,
    engine: str | None = None,
) -> "tuple[StoredLayout | None, list[FieldChange]]":
    """As :func:`check_compatible`, also returning the stored state itself (``None`` for a
    checkpoint without committed state): its engine, and its layout's settings for
    :meth:`~sparkstate.engines.base.Engine.for_checkpoint`."""
    try:
        if not has_state(checkpoint, spark):
            return None, []
    except FsUnavailable as exc:  # Spark Connect on a store this process cannot reach: said, not skipped silently
        logging.getLogger("sparkstate").warning("the state in checkpoint %s was not checked: %s", checkpoint, exc)
        return None, []
    if not has(STATE_READERS) and is_connect(spark):  # said, not skipped silently; the query itself still
        # refuses a layout it cannot read
        logging.getLogger("sparkstate").warning(
            "the state in checkpoint %s was not checked: PySpark %s has no state reader and a Spark Connect client"
            " no JVM to read Spark's state store with (4.0 has the reader)", checkpoint,
            ".".join(map(str, pyspark_minor())))
        return None, []
    stored = stored_layout(spark, checkpoint)
    refusal = stored.restart_refusal()
    if refusal is not None:
        raise StateSchemaError(f"the state in checkpoint {checkpoint} {refusal}")
    written_by = stored.engine
    if engine is not None and written_by != engine:
        raise StateSchemaError(
            f"the state in checkpoint {checkpoint} was written by the {written_by!r} engine and this query runs on"
            f" the {engine!r} engine, which lays state out differently. Run it with engine={written_by!r}"
            f" (CLI: --engine {written_by}), or move the state: export it (`sparkstate state export CHECKPOINT"
            " state.parquet`) and start the new query on a new checkpoint with"
            " initial_state=spark.read.parquet(\"state.parquet\")."
        )
    old_key, old_states = stored.schemas()
    key_changes = [
        FieldChange(f"key {c.path}", c.change if c.change != "added without a default" else "added", c.old, c.new, False)
        for c in diff_schemas(old_key, key_schema)
    ]
    defaulted = _defaulted(state_type) if state_type is not None else set()
    # every state type stored rows still hold must fit (after a change, untouched keys keep theirs)
    changes = list(key_changes)
    for old_state in old_states:
        for c in diff_schemas(old_state, state_schema, defaulted):
            if c not in changes:
                changes.append(c)
    bad = [c for c in changes if not c.compatible]
    if bad:
        lines = "\n".join(f"  - {c}{'' if not c.compatible else '  [compatible]'}" for c in changes)
        raise StateSchemaError(
            f"the state in checkpoint {checkpoint} does not fit this query's "
            f"{'key and state' if key_changes else 'state type'}; restarting would lose or corrupt it:\n{lines}\n"
            "Compatible changes are: adding a field with a default (or Optional), removing a field, widening a"
            " number. To move the state anyway, export it (`sparkstate state export CHECKPOINT state.parquet`"
            " or ss.state.export), reshape the Parquet to the new fields, and start the new query on a new"
            " checkpoint with initial_state=spark.read.parquet(\"state.parquet\")."
        )
    return stored, changes


def key_struct(df_schema: StructType, keys: tuple[str, ...]) -> StructType:
    """The key schema a query with these key columns stores."""
    by_name = {f.name: f for f in df_schema.fields}
    return StructType([StructField(k, by_name[k].dataType, True) for k in keys])
