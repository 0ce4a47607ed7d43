"""The rules of ``map_batches_with_state`` (docs/vectorized.md, :mod:`sparkstate.state_batch`):
``batch.state`` built from stored entries, and a :class:`~sparkstate.StateUpdate` turned into
state writes (:class:`BatchRules`), shared by the Spark engine (``engines/batched/vectorized.py``)
and the no-Spark harness (:class:`sparkstate.testing.BatchStateHarness`), so the two cannot drift apart.
"""

from __future__ import annotations

from itertools import repeat
from operator import is_not, itemgetter
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ConfigError, StateTypeError, TimeoutConfigError, UserFunctionError
from ..group_state import (
    BEFORE_WATERMARK,
    NO_TIMEOUT,
    NO_WATERMARK,
    NOT_AFTER_PROCESSING_TIME,
    GroupStateTimeout,
    StateArgumentError,
    timeout_refusal,
)
from ..state_batch import BOOKKEEPING, EXISTS, TIMED_OUT, TIMEOUT, StateBatch, StateUpdate
from .runtime import arrow_type

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql.types import DataType, StructType

    from ..types import Codec

#: The stored entry of a key without one (no state, no timeout): entries are ``[cols, timeout, ...]``.
NO_ENTRY = (None, None)


def _nullable_ints() -> Callable[[Any], Any]:
    import pandas as pd
    import pyarrow as pa

    mapping = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.int16(): pd.Int16Dtype(),
               pa.int8(): pd.Int8Dtype(), pa.bool_(): pd.BooleanDtype()}
    return mapping.get


def _describe(series: Any) -> str:
    return str(getattr(series, "dtype", type(series).__name__))


class BatchRules:
    """Builds ``batch.state`` from stored entries and turns a :class:`StateUpdate` into writes.

    ``key_types``: the Spark types of the key columns; stored keys are the values
    ``DataFrame.collect()`` gives (a scalar for one key column, a tuple for several), stored state
    the codec's column tuple (``Codec.encode_columns``), as the other operators store them.
    """

    def __init__(self, operator: str, func: Callable, key_columns: tuple[str, ...], key_types: list["DataType"],
                 codec: "Codec", timeout: GroupStateTimeout, output_schema: "StructType | None") -> None:
        from .row_values import arrow_column_converter

        self.operator = operator
        self.func = func
        self.key_columns = tuple(key_columns)
        self.single = len(self.key_columns) == 1
        self.key_arrow = [arrow_type(t) for t in key_types]
        self.key_convs = [arrow_column_converter(t) for t in key_types]
        self.fields = tuple(codec.fields)
        self.struct = codec.is_struct
        state_fields = codec.columns.fields
        self.state_arrow = [arrow_type(f.dataType) for f in state_fields]
        self.state_convs = [arrow_column_converter(f.dataType) for f in state_fields]
        self.timeout = timeout
        self.output_schema = output_schema
        if output_schema is not None:
            self.output_names = list(output_schema.names)
            self.output_arrow = [arrow_type(f.dataType) for f in output_schema.fields]
        self.empty = (None,) * len(self.fields)
        self.mapper = _nullable_ints()

    # -- batch.state ------------------------------------------------------------------------------
    def state_frame(self, keys: list, entries: list, n_input: int, key_arrays: list | None = None) -> "pd.DataFrame":
        """``batch.state`` for ``keys`` (the first ``n_input`` have new rows, the rest timed out)
        whose stored entries (``[cols, timeout, ...]``, :data:`NO_ENTRY` for none) are ``entries``; ``key_arrays``: the
        key columns of the first ``n_input`` keys as Arrow arrays (as the rows have them), if at hand."""
        import numpy as np
        import pandas as pd
        import pyarrow as pa

        n = len(keys)
        data: dict = {}
        if key_arrays is not None:
            rest = keys[n_input:]
            rest_cols: list[Any] = [rest] if self.single else (list(zip(*rest)) if rest else [[] for _ in self.key_columns])
            for name, arr, vals in zip(self.key_columns, key_arrays, rest_cols):
                if vals:
                    arr = pa.concat_arrays([arr, pa.array(vals, type=arr.type)])
                data[name] = arr.to_pandas()
        else:
            key_cols: list[Any] = [keys] if self.single else (list(zip(*keys)) if n else [[] for _ in self.key_columns])
            for name, vals, t in zip(self.key_columns, key_cols, self.key_arrow):
                data[name] = pa.array(vals, type=t).to_pandas()
        first = list(map(itemgetter(0), entries))
        empty = self.empty
        per_field: list[Any] = list(zip(*[c or empty for c in first])) if n else [[] for _ in self.fields]
        for name, vals, t in zip(self.fields, per_field, self.state_arrow):
            data[name] = pa.array(vals, type=t).to_pandas(types_mapper=self.mapper)
        data[EXISTS] = np.fromiter(map(is_not, first, repeat(None)), bool, n)
        data[TIMEOUT] = pa.array(list(map(itemgetter(1), entries)), pa.int64()).to_pandas(types_mapper=self.mapper)
        timed_out = np.zeros(n, bool)
        timed_out[n_input:] = True
        data[TIMED_OUT] = timed_out
        return pd.DataFrame(data)

    # -- the call ---------------------------------------------------------------------------------
    def call(self, rows: "pd.DataFrame", keys: list, entries: list, n_input: int, pt: int, wm: int,
             has_watermark: bool, key_index: Any, key_arrays: list | None = None,
             index: dict | None = None) -> tuple[Any, dict]:
        """Run the function on one bucket's call; returns (the output frame or None, the writes:
        key -> (state columns, timeout) or None to remove the key)."""
        batch = StateBatch(rows, self.state_frame(keys, entries, n_input, key_arrays),
                           max(wm, 0) if has_watermark else -1, pt, key_index)
        name = getattr(self.func, "__name__", self.func)
        try:
            update = self.func(batch)
        except (ConfigError, StateTypeError, TimeoutConfigError):
            raise
        except Exception as exc:
            raise UserFunctionError(
                f"the state function {name!r} of {self.operator} raised {type(exc).__name__}: {exc}"
                f" (a call with {len(keys)} key(s), {len(rows)} row(s)). Fix the function and restart the query"
                " on the same checkpoint: the failed batch is processed again."
            ) from exc
        if update is None:
            update = StateUpdate()
        if not isinstance(update, StateUpdate):
            raise StateTypeError(
                f"{self.operator}: the function {name!r} must return ss.StateUpdate(state=..., remove=...,"
                f" output=...), got {type(update).__name__}"
            )
        if index is None:
            index = dict(zip(keys, range(len(keys))))
        writes: dict = {}
        if update.state is not None:
            self._set(update.state, index, entries, n_input, pt, wm, has_watermark, writes)
        if update.remove is not None:
            for k in self._remove_keys(update.remove, index):
                if k in writes:
                    raise ConfigError(
                        f"{self.operator}: key {k!r} is both in StateUpdate.state and in StateUpdate.remove;"
                        " keep it in one of them"
                    )
                writes[k] = None
        for k in keys[n_input:]:  # a timed-out key neither set nor removed goes (its timeout fired)
            if k not in writes:
                writes[k] = None
        return self._output(update.output), writes

    # -- reading what the function returned ------------------------------------------------------
    def _frame(self, value: Any, what: str) -> "pd.DataFrame":
        import pandas as pd

        if not isinstance(value, pd.DataFrame):
            raise StateTypeError(f"{self.operator}: StateUpdate.{what} must be a pandas DataFrame, got"
                                 f" {type(value).__name__}")
        return value

    def _arrow(self, series: Any, t: Any, what: str, expected: str) -> Any:
        import pyarrow as pa

        try:
            return pa.Array.from_pandas(series, type=t, safe=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError,
                OverflowError) as exc:
            raise StateTypeError(
                f"{self.operator}: {what} must hold {expected} ({t}); got dtype {_describe(series)}: {exc}"
            ) from None

    def _keys_of(self, frame: "pd.DataFrame", what: str) -> list:
        missing = [c for c in self.key_columns if c not in frame.columns]
        if missing:
            raise StateTypeError(
                f"{self.operator}: StateUpdate.{what} needs the key column(s) {', '.join(self.key_columns)};"
                f" missing {', '.join(missing)}; it has {', '.join(map(str, frame.columns))}"
            )
        cols = [conv(self._arrow(frame[c], t, f"StateUpdate.{what} column {c!r}", "the key column's type"))
                for c, t, conv in zip(self.key_columns, self.key_arrow, self.key_convs)]
        return cols[0] if self.single else list(zip(*cols))

    def _known(self, keys: Any, index: dict, what: str) -> None:
        if index.keys() >= (keys if isinstance(keys, set) else set(keys)):
            return
        for k in keys:
            if k not in index:
                raise ConfigError(
                    f"{self.operator}: StateUpdate.{what} names key {k!r}, which is not in batch.state; a call may"
                    " set or remove only the keys it was given (keys with new rows or a due timeout)"
                )

    def _set(self, frame: Any, index: dict, entries: list, n_input: int, pt: int, wm: int, has_watermark: bool,
             writes: dict) -> None:
        frame = self._frame(frame, "state")
        allowed = set(self.key_columns) | set(self.fields) | set(BOOKKEEPING)
        extra = [str(c) for c in frame.columns if c not in allowed]
        missing = [f for f in self.fields if f not in frame.columns]
        if extra or missing:
            raise StateTypeError(
                f"{self.operator}: StateUpdate.state must have the key column(s) {', '.join(self.key_columns)}, the"
                f" state's field(s) {', '.join(self.fields)} and optionally {TIMEOUT};"
                + (f" missing {', '.join(missing)};" if missing else "")
                + (f" unexpected {', '.join(extra)};" if extra else "")
                + " select those columns (e.g. df[[...]])"
            )
        keys = self._keys_of(frame, "state")
        distinct = set(keys)
        self._known(distinct, index, "state")
        if len(distinct) != len(keys):
            seen: set = set()
            dup = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise ConfigError(f"{self.operator}: StateUpdate.state has more than one row for key {dup!r}")
        per_field = [conv(self._arrow(frame[f], t, f"StateUpdate.state column {f!r}", "the state field's type"))
                     for f, t, conv in zip(self.fields, self.state_arrow, self.state_convs)]
        if not self.struct:
            nulls = [k for k, v in zip(keys, per_field[0]) if v is None]
            if nulls:
                raise StateTypeError(
                    f"{self.operator}: StateUpdate.state has a null value for key {nulls[0]!r}: None cannot be"
                    " stored as state; put the key in StateUpdate.remove instead"
                )
        timeouts: Any = self._timeouts(frame, keys, pt, wm, has_watermark) if TIMEOUT in frame.columns else None
        if timeouts is None:
            if self.timeout is GroupStateTimeout.NoTimeout:
                timeouts = repeat(None)
            else:  # kept by keys with new rows, gone for timed-out ones (their timeout fired)
                timeouts = [None if (j := index[k]) >= n_input else entries[j][1] for k in keys]
        writes.update(zip(keys, zip(zip(*per_field), timeouts)))

    def _timeouts(self, frame: "pd.DataFrame", keys: list, pt: int, wm: int, has_watermark: bool) -> list:
        import pyarrow as pa

        arr = self._arrow(frame[TIMEOUT], pa.int64(), f"StateUpdate.state column {TIMEOUT!r}", "epoch milliseconds")
        values = arr.to_pylist()
        conf = self.timeout
        watermark = max(wm, 0) if has_watermark else NO_WATERMARK
        for k, t in zip(keys, values):
            if t is None:
                continue
            why = timeout_refusal(conf, t, pt, watermark)
            if why == NO_TIMEOUT:
                raise TimeoutConfigError(
                    f"{self.operator}: StateUpdate.state sets timeout_ms {t} for key {k!r}, but the query has no"
                    " timeout. Pass timeout=ss.GroupStateTimeout.ProcessingTimeTimeout or EventTimeTimeout, or"
                    " leave timeout_ms null"
                )
            if why == NOT_AFTER_PROCESSING_TIME:
                raise StateArgumentError(
                    f"{self.operator}: timeout_ms {t} of key {k!r} is not later than the batch's processing time"
                    f" ({pt}); set it as batch.processing_time_ms + a positive duration"
                )
            if why == BEFORE_WATERMARK:
                raise StateArgumentError(
                    f"{self.operator}: timeout_ms {t} of key {k!r} is earlier than the current watermark"
                    f" ({watermark}); base it on the watermark, e.g. batch.watermark_ms + gap_ms"
                )
        return values

    def _remove_keys(self, remove: Any, index: dict) -> list:
        import pandas as pd

        if isinstance(remove, pd.DataFrame):
            keys = self._keys_of(remove, "remove")
        elif isinstance(remove, (list, tuple, set, pd.Series, pd.Index)):
            values = list(remove)
            if self.single:
                frame = pd.DataFrame({self.key_columns[0]: pd.Series(values, dtype=object)})
            else:
                bad = [v for v in values if not isinstance(v, tuple) or len(v) != len(self.key_columns)]
                if bad:
                    raise StateTypeError(
                        f"{self.operator}: StateUpdate.remove as a list needs one tuple of"
                        f" ({', '.join(self.key_columns)}) per key, got {bad[0]!r}"
                    )
                frame = pd.DataFrame(
                    {c: pd.Series([v[i] for v in values], dtype=object) for i, c in enumerate(self.key_columns)})
            keys = self._keys_of(frame, "remove")
        else:
            raise StateTypeError(
                f"{self.operator}: StateUpdate.remove must be a DataFrame with the key column(s) or a list of keys,"
                f" got {type(remove).__name__}"
            )
        self._known(keys, index, "remove")
        return keys

    def _output(self, output: Any) -> Any:
        if output is None or self.output_schema is None:
            return output
        frame = self._frame(output, "output")
        names = self.output_names
        missing = [c for c in names if c not in frame.columns]
        extra = [str(c) for c in frame.columns if c not in names]
        if missing or extra:
            raise StateTypeError(
                f"{self.operator}: StateUpdate.output must have output_type's columns {', '.join(names)};"
                + (f" missing {', '.join(missing)};" if missing else "")
                + (f" unexpected {', '.join(extra)};" if extra else "")
                + " rename or select columns to match output_type"
            )
        frame = frame[names] if list(frame.columns) != names else frame
        for c, t in zip(names, self.output_arrow):
            self._arrow(frame[c], t, f"StateUpdate.output column {c!r}", "output_type's type")
        return frame
