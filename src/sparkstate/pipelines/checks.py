"""Definition-time checks shared by the pipelines: the input is a DataFrame, columns exist and
have the right types. Every message names the pipeline, the column and the fix.

>>> import sparkstate as ss
>>> df = ss.spark_session().createDataFrame([("a",)], "word string")
>>> check_column(df, "word", "key", "running_count")
>>> check_column(df, "user", "key", "running_count")
Traceback (most recent call last):
...
sparkstate.errors.ConfigError: running_count: key column 'user' is not in the input; its columns are word. Pass key=<column name>.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from ..errors import ConfigError


def require_dataframe(df: Any, pipeline: str, what: str = "events") -> DataFrame:
    """``df`` if it is a pyspark DataFrame, else a ConfigError naming what arrived."""
    if not isinstance(df, DataFrame):
        raise ConfigError(f"{pipeline}: expected a pyspark DataFrame of {what}, got {type(df).__name__}")
    return df


def check_column(
    df: DataFrame, name: Any, what: str, pipeline: str, allowed: tuple[type, ...] = (), want: str = ""
) -> None:
    """Raise ConfigError unless ``name`` is a column of ``df`` (of one of the ``allowed`` types)."""
    if not isinstance(name, str) or name not in df.columns:
        raise ConfigError(
            f"{pipeline}: {what} column {name!r} is not in the input; its columns are {', '.join(df.columns)}."
            f" Pass {what}=<column name>."
        )
    dtype = df.schema[name].dataType
    if allowed and not isinstance(dtype, allowed):
        raise ConfigError(
            f"{pipeline}: {what} column {name!r} must be of type {want}, but it is {dtype.simpleString()}."
            f" Convert it first, e.g. df.withColumn({name!r}, F.col({name!r}).cast({want!r}))."
        )
