"""The tws engine on PySpark 4.0, which has ``transformWithStateInPandas`` but no
``transformWithState`` with Rows: :class:`KeyProcessor` with a key's rows handed over as pandas
frames and its outputs given back as one.

The state is the same value-state variable, with the same TTL, as on 4.1 and later (the processor
is :class:`KeyProcessor`); only the way rows come and go differs. PySpark's pandas conversion of the
input is undone as the batched engine undoes it (:mod:`..batched.pandas_values`): timestamps back
to UTC instants, integers with nulls back to ints; a long column also travels as a string
companion (:func:`with_long_companions`), since a long column with a null would arrive as
float64 and lose every digit past 2**53.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Iterator

from pyspark.sql.types import LongType, StructType

from ...types import row_class
from ...types.encode import RowTypeError, columns_encoder
from ...errors import StateTypeError
from ..base import RESERVED_PREFIX, StatePlan
from ..batched.pandas_values import pandas_column_converter, zone
from ..row_values import output_frame_maker
from .processor import KeyProcessor

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LONG_COMPANION = f"{RESERVED_PREFIX}long_"


def with_long_companions(df: "DataFrame") -> "DataFrame":
    """``df`` with, after its own columns, each long column again as a string, in column order."""
    from pyspark.sql import functions as F

    longs = [f.name for f in df.schema.fields if isinstance(f.dataType, LongType)]
    return df.select("*", *[F.col(f"`{n}`").cast("string").alias(f"{LONG_COMPANION}{i}") for i, n in enumerate(longs)])


def frame_reader(schema: StructType, tz: str) -> Any:
    """A function turning one pandas frame of ``with_long_companions(df)`` (``schema``:
    ``df``'s) into ``df``'s columns as lists of the values the Row API gives."""
    where = zone(tz)
    n = len(schema.fields)
    picks, convs = [], []
    j = 0
    for i, f in enumerate(schema.fields):
        if isinstance(f.dataType, LongType):
            picks.append(n + j)
            j += 1
        else:
            picks.append(i)
        convs.append(pandas_column_converter(f.dataType, where))

    def read(pdf: Any) -> list[list]:
        return [conv(pdf.iloc[:, p]) for p, conv in zip(picks, convs)]

    return read


class PandasKeyProcessor(KeyProcessor):
    """The tws engine's processor for ``transformWithStateInPandas`` (PySpark 4.0).

    ``input_schema``: the query's input (the frames hold it with its long companions);
    ``initial_schema``: the initial state's, or None; ``tz``: the session time zone PySpark
    converted timestamps with.
    """

    def __init__(self, plan: StatePlan, input_schema: StructType, tz: str,
                 initial_schema: StructType | None = None) -> None:
        super().__init__(plan, input_schema)
        self.tz = tz
        self.initial_schema = initial_schema

    def init(self, handle: Any) -> None:
        super().init(handle)
        self.fix_row = None  # the frame reader gives structs as Rows and maps as dicts already
        schema = self.input_schema
        self.read_rows = frame_reader(schema, self.tz)
        self.key_pos = [schema.names.index(k) for k in self.plan.key_columns]
        self.make_row = self.decode_value or partial(tuple.__new__, row_class(schema.names))
        self.decode_value = None  # applied by make_row
        if self.initial_schema is not None:
            self.read_initial = frame_reader(self.initial_schema, self.tz)
        self.encode_output_columns = columns_encoder(self.plan.output_schema, "output")
        self.output_frame = output_frame_maker(self.plan.output_schema)

    def emit(self, key: Any, outputs: list) -> list:
        if not outputs:
            return []
        try:
            cols = self.encode_output_columns(outputs)
        except RowTypeError as exc:
            raise StateTypeError(
                f"{self.plan.operator}: an output for key {key!r} does not match output_type: {exc}"
            ) from None
        return [self.output_frame(cols)]

    def _rows(self, frames: Iterator[Any]) -> tuple[Any, list]:
        """The key (as the Row API gives it, from the converted columns) and the key's rows."""
        key: Any = None
        rows: list = []
        for pdf in frames:
            if len(pdf) == 0:
                continue
            cols = self.read_rows(pdf)
            if key is None:
                key = tuple(cols[p][0] for p in self.key_pos)
            rows.extend(map(self.make_row, zip(*cols)))
        return key, rows

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        exact_key, values = self._rows(rows)
        return super().handleInputRows(key if exact_key is None else exact_key, iter(values), timerValues)

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        if len(initialState) == 0:
            return
        cols = self.read_initial(initialState)
        for row in zip(*cols):
            super().handleInitialState(row[: len(self.plan.key_columns)], row, timerValues)
