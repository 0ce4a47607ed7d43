"""Rows a pipeline refuses because a column already says why (``reason=``), and what they carry out.

A row whose ``reason`` column is set (e.g. by a parser: a missing field, a wrong type) is not
given to the pipeline's function and changes no state: it comes out as an output row whose
:data:`REJECTED` struct column (null on the pipeline's own rows) holds that ``reason``, then the
``carry`` columns (e.g. the raw record), with the pipeline's other columns null but the key.
``sparkstate run`` passes the parse's reasons this way to every pipeline but processing-time
sessionize, so that its query reads each record once.

The update-mode pipelines (:func:`~sparkstate.pipelines.running_count`,
:func:`~sparkstate.pipelines.first_last_activity`, :func:`~sparkstate.pipelines.visited_pages`)
wrap their functions in :class:`RefusingGroups` or :class:`RefusingRecords`; sessionize refuses
rows in its own group function, beside the late ones, and shares the checks.

>>> f = RefusingGroups(lambda key, rows, state: (key, len(rows)), at=1, width=2)
>>> f("a", [("a", None, b"1"), ("a", "bad", b"2"), ("a", None, b"3")], None)
[('a', 2, None), ('a', None, ('bad', b'2'))]
>>> f("b", [("b", "bad", b"4")], None)   # a key with only refused rows: its function is not called
[('b', None, ('bad', b'4'))]
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql.types import StringType, StructField, StructType

from ..errors import ConfigError
from .checks import check_column

#: The output column holding a row a pipeline refused, with its reason; null on the pipeline's own
#: rows. Its fields: ``reason``, then (sessionize) the refused event's fields, then the ``carry`` columns.
REJECTED = "rejected"


def check_carry(df: DataFrame, pipeline: str, carry: Sequence[str] | str, taken: Iterable[Any]) -> list[str]:
    """``carry`` as a list of columns of ``df``, none of them in ``taken`` (the pipeline's own) nor ``reason``."""
    carry = [carry] if isinstance(carry, str) else list(carry)
    used = set(taken)
    for c in carry:
        check_column(df, c, "carry", pipeline)
        if c in used or c == "reason":
            raise ConfigError(f"{pipeline}: carry column {c!r} is already a column {pipeline} uses; name others")
    return carry


def check_reason(df: DataFrame, pipeline: str, reason: str, taken: Iterable[Any]) -> None:
    """``reason`` is a string column of ``df``, not in ``taken`` (the pipeline's columns and the carried ones)."""
    check_column(df, reason, "reason", pipeline, (StringType,), "string")
    if reason in set(taken):
        raise ConfigError(f"{pipeline}: reason column {reason!r} is already a column {pipeline} uses; name another")


def refusal_columns(df: DataFrame, pipeline: str, reason: str | None, carry: Sequence[str] | str, key: str,
                    others: Iterable[str] = ()) -> list[str]:
    """The checked ``carry`` columns of an update-mode pipeline, whose output is ``key`` and its own
    columns, then :data:`REJECTED` with ``reason``; ``others``: its other input columns."""
    taken = {key, *others}
    carry = check_carry(df, pipeline, carry, taken)
    if reason is None:
        if carry:
            raise ConfigError(f"{pipeline}: carry= copies columns into refused rows, which only reason= makes"
                              " (pass reason=<column saying why a row is refused>)")
        return carry
    check_reason(df, pipeline, reason, taken | set(carry))
    if key == REJECTED:
        raise ConfigError(f"{pipeline}: with reason= the output has a column {REJECTED} beside the key, so the key"
                          f" column cannot be called {REJECTED!r}; rename it first")
    return carry


def rejected_field(df: DataFrame, carry: Sequence[str], event: Sequence[StructField] = ()) -> StructField:
    """The :data:`REJECTED` output column: ``reason``, the ``event`` fields, the ``carry`` columns of ``df``."""
    fields = [StructField("reason", StringType(), True), *event]
    fields += [StructField(c, df.schema[c].dataType, True) for c in carry]
    return StructField(REJECTED, StructType(fields), True)


def _refused(key: Any, row: Any, at: int, width: int) -> tuple:
    """A refused ``row`` (its reason at ``at``, the carried values after it) as an output row of
    ``width`` columns (the key, then nulls) and its :data:`REJECTED` record."""
    return (key, *(None,) * (width - 1), tuple(row[at:]))


class RefusingGroups:
    """A group function ``func(key, rows, state) -> output | None`` as a flat one that refuses rows.

    Each row holds the function's columns, then the reason at index ``at``, then the carried
    columns. Rows without a reason go to ``func`` (as a list; ``func`` is not called for a key
    whose rows are all refused, so its state is untouched); each refused row comes out as
    :func:`_refused` makes it. ``width``: the output's columns before :data:`REJECTED`.
    """

    def __init__(self, func: Callable, at: int, width: int) -> None:
        self.func, self.at, self.width = func, at, width
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, key: Any, rows: Iterable[Any], state: Any) -> list:
        good, out = [], []
        for r in rows:
            if r[self.at] is None:
                good.append(r)
            else:
                out.append(_refused(key, r, self.at, self.width))
        if good:
            result = self.func(key, good, state)
            if result is not None:
                out.insert(0, (*result, None))
        return out


class RefusingRecords:
    """A per-record function ``func(key, value, state) -> output | None`` (``map_with_state``) that refuses
    records: it is given whole records, whose value is at ``value_at`` and reason at ``at`` (the
    carried columns after it); a refused record comes out as :func:`_refused` makes it, without
    calling ``func``. ``width``: the output's columns before :data:`REJECTED`.
    """

    def __init__(self, func: Callable, value_at: int, at: int, width: int) -> None:
        self.func, self.value_at, self.at, self.width = func, value_at, at, width
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, key: Any, record: Any, state: Any) -> tuple | None:
        if record is not None and record[self.at] is not None:
            return _refused(key, record, self.at, self.width)
        result = self.func(key, None if record is None else record[self.value_at], state)
        return None if result is None else (*result, None)


__all__ = ["REJECTED", "RefusingGroups", "RefusingRecords", "check_carry", "check_reason", "refusal_columns",
           "rejected_field"]
