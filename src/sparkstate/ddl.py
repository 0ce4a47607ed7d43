"""DDL strings (``"user_id string, amount decimal(10,2)"``): the one place they are read.

:func:`parse_ddl` asks Spark (on a classic or a Connect session), so it needs a running session;
:func:`column_names` reads only the top-level names, without Spark, for places that run before
a session exists (the CLI's help).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import DataType


class NoSparkError(Exception):
    """No SparkSession or SparkContext to parse DDL with (Spark parses DDL in the JVM)."""


def parse_ddl(ddl: str) -> "DataType":
    """The Spark type of ``ddl``, parsed by the active session; :class:`NoSparkError` without one.

    Spark's own errors (a ``ParseException``) pass through: each caller words them for its setting.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is not None and hasattr(spark, "_parse_ddl"):  # classic and Connect alike, PySpark 4.0+
        return spark._parse_ddl(ddl)  # type: ignore[attr-defined]
    if SparkContext._active_spark_context is None:
        raise NoSparkError(ddl)
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(ddl)


def column_names(ddl: str) -> list[str]:
    """The top-level column names of a DDL column list, read without Spark.

    Commas inside a type (``decimal(10,2)``, ``map<string,int>``, ``struct<a:int,b:int>``) and in
    a backquoted name do not split columns.

    >>> column_names("user_id string, amount decimal(10,2), tags map<string, int>, `a,b` int")
    ['user_id', 'amount', 'tags', 'a,b']
    """
    columns: list[str] = []
    part: list[str] = []
    depth, quoted = 0, False
    for ch in ddl + ",":
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "(<":
            depth += 1
        elif not quoted and ch in ")>":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            text = "".join(part).strip()
            if text:
                columns.append(_first_name(text))
            part = []
            continue
        part.append(ch)
    return columns


def _first_name(column: str) -> str:
    if column.startswith("`"):
        end = column.index("`", 1)
        return column[1:end].replace("``", "`")
    return column.split()[0].rstrip(":")
