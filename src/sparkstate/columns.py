"""Column expressions that steer Spark's optimizer and code generation.

:func:`batch_time` keeps Spark's generated code the same in every micro-batch.
Spark compiles each stage's generated Java code and keeps the classes by their source text. A
value written into that text, such as the micro-batch's time (``current_timestamp()``, which
Spark turns into a literal per batch), makes the source differ in every batch, so the stage is
compiled again each time: in a streaming job that is 5-40 ms per stage and batch, on the driver
and again in a task.

>>> import sparkstate as ss
>>> from pyspark.sql import functions as F
>>> df = ss.spark_session().range(1).select(batch_time().alias("t"), F.current_timestamp().alias("now"))
>>> row = df.first(); row.t == row.now
True
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F


def once(column: Column) -> Column:
    """``column`` made non-deterministic (its value unchanged).

    Spark's optimizer copies a deterministic expression into every filter and column that reads
    its alias (pushing ``reason IS NULL`` through a projection, merging projections) and folds
    one of constants into a literal; it does neither to a non-deterministic expression, so it is
    computed once per row and step, and kept as written.
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
    micros = F.reflect(F.lit("java.lang.Long"), F.lit("toString"), F.unix_micros(F.current_timestamp()))
    return F.timestamp_micros(micros.cast("long"))


__all__ = ["batch_time", "once"]
