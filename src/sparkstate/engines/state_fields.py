"""Fitting state columns stored under an older state type to the current one, by field name
(fields not stored read as null, so the decoder applies defaults): what both engines' processors
and layouts do when the state type changed since a key was written.
"""

from __future__ import annotations

from typing import Any


def relay(stored: tuple[str, ...], current: tuple[str, ...]) -> tuple[int | None, ...]:
    """Where each current field sits among the stored ones (None: not stored, reads as null)."""
    pos = {n: i for i, n in enumerate(stored)}
    return tuple(pos.get(n) for n in current)


def _coercer(dt: Any) -> Any:
    """A function fitting a value stored under an older state type to ``dt`` (numbers widened,
    structs matched by field name, missing fields null), as Spark's ``createDataFrame`` takes it."""
    from pyspark.sql import Row
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, MapType, StructType

    if isinstance(dt, (DoubleType, FloatType)):
        return lambda v: None if v is None else float(v)
    if isinstance(dt, StructType):
        names = dt.names
        subs = [_coercer(f.dataType) for f in dt.fields]

        def struct(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, Row) and hasattr(v, "__fields__"):
                d = v.asDict()
                return tuple(c(d.get(n)) for n, c in zip(names, subs))
            if isinstance(v, dict):
                return tuple(c(v.get(n)) for n, c in zip(names, subs))
            return tuple(c(x) for c, x in zip(subs, v))
        return struct
    if isinstance(dt, ArrayType):
        elem = _coercer(dt.elementType)
        return lambda v: None if v is None else [elem(x) for x in v]
    if isinstance(dt, MapType):
        kc, vc = _coercer(dt.keyType), _coercer(dt.valueType)
        return lambda v: None if v is None else {kc(k): vc(x) for k, x in v.items()}
    return lambda v: v


def relayer(stored: Any, target: Any) -> Any:
    """Columns written under the Spark struct ``stored`` -> columns of ``target`` (by name,
    missing ones null, values coerced), for the state tools."""
    idx = relay(tuple(stored.names), tuple(target.names))
    plan = [(i, _coercer(f.dataType)) for i, f in zip(idx, target.fields)]
    return lambda cols: tuple(None if i is None else c(cols[i]) for i, c in plan)
