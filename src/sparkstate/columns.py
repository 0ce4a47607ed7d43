"""Column expressions that steer Spark's optimizer and code generator.

:func:`once` keeps an expression computed once per row, where Spark's optimizer would copy it
into every expression that reads it. :func:`batch_time` keeps the micro-batch's time out of the
generated code: Spark compiles each stage's generated Java code and keeps the classes by their
source text, and a value written into that text (``current_timestamp()``, a literal that
changes with every batch) makes the stage compile again in each batch, 5-40 ms a stage, on the
driver and again in a task.

>>> import sparkstate as ss
>>> from pyspark.sql import functions as F
>>> df = ss.spark_session().range(1).select(batch_time().alias("t"), F.current_timestamp().alias("now"))
>>> row = df.first(); row.t == row.now
True
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F


#: :func:`batch_time` in microseconds, as text (SQL): the call Spark evaluates outside generated code.
BATCH_MICROS_SQL = "reflect('java.lang.Long', 'toString', unix_micros(current_timestamp()))"


def once(column: Column) -> Column:
    """``column`` made non-deterministic (its value unchanged).

    Spark's optimizer copies a deterministic expression into every filter and column that reads
    its alias (pushing ``reason IS NULL`` through a projection, merging projections): one
    ``from_csv`` per record became 12 to 120 copies in a plan. It copies no non-deterministic
    expression, so this one is computed once per row and step.
    """
    return F.when(F.spark_partition_id() >= 0, column)  # always the column


def batch_time() -> Column:
    """The query's time, ``current_timestamp()`` (in a stream the micro-batch's time, the same
    again on a replay), kept out of the generated code.

    In a stream Spark puts the batch's time into the physical plan as a timestamp literal, which
    generated code holds as a number. Here it is read through ``reflect`` (the microseconds'
    text from ``java.lang.Long.toString``), an expression Spark evaluates without generating
    code for it or its inputs, then turned back into a timestamp: a call and a parse of 16 digits
    per row that reads it (a dead letter), instead of a compilation per stage and batch.
    """
    return F.expr(f"timestamp_micros(CAST({BATCH_MICROS_SQL} AS BIGINT))")


__all__ = ["BATCH_MICROS_SQL", "batch_time", "once"]
