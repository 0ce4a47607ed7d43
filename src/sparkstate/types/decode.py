"""Decoding: the external value Spark hands to Python -> the Python type (dataclasses rebuilt
positionally; a stored null in a field that is not ``Optional`` takes the field's default)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import typing
from typing import Any, Callable

from pyspark.sql import Row

from .mapping import field_hints, is_dataclass_type, unwrap_optional

def identity(v: Any) -> Any:
    return v


def first_column(cols: Any) -> Any:
    return cols[0]


def decoder_for(tp: Any) -> Callable[[Any], Any]:
    """A function rebuilding a value of Python type ``tp`` from what Spark returns."""
    tp, _ = unwrap_optional(tp)
    if is_dataclass_type(tp):
        return dataclass_decoder(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, tuple):
        elem = decoder_for(args[0])
        conv = tuple if origin is tuple else list
        if elem is identity and conv is list:
            return lambda v: None if v is None else list(v)
        return lambda v: None if v is None else conv(elem(x) for x in v)
    if origin is dict:
        kdec, vdec = decoder_for(args[0]), decoder_for(args[1])
        if kdec is identity and vdec is identity:
            return lambda v: None if v is None else dict(v)
        return lambda v: None if v is None else {kdec(k): vdec(x) for k, x in v.items()}
    if tp is float:
        return lambda v: None if v is None else float(v)
    if tp is _dt.datetime:
        return _to_utc
    return identity


def _to_utc(v: Any) -> Any:
    # Input rows reach Python as UTC-aware datetimes, but state read back from the JVM is naive
    # (local time). Hand out one kind: aware, in UTC, so they compare with each other.
    if v is None:
        return None
    return v.astimezone(_dt.timezone.utc)


def dataclass_decoder(cls: type) -> Callable[[Any], Any]:
    hints = field_hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        inner, optional = unwrap_optional(hints[f.name])
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
