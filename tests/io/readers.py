"""A file sink's directory read the way each kind of reader reads it: Spark, pandas, pyarrow, DuckDB.

Spark follows ``DIR/_spark_metadata`` when there is one; pandas (``read_parquet(DIR)``) and
pyarrow (``pyarrow.dataset.dataset(DIR)``) list the directory and skip names starting with ``_``
or ``.``; DuckDB reads the glob ``DIR/*.<format>`` (its directory read and ``**`` walk into hidden
directories, see ``sparkstate.io.files``). pandas has no directory reader for JSON lines: it
reads each file the glob finds, as a pandas user does.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from typing import Sequence

import duckdb
import pandas as pd
import pyarrow.dataset as ds
from pyspark.errors import AnalysisException

READERS = ("spark", "pandas", "pyarrow", "duckdb")
_EXT = {"parquet": "parquet", "json": "json"}


def _records(frame: pd.DataFrame, columns: Sequence[str]) -> Counter:
    if frame.empty:  # no file yet (a reader then finds no columns either)
        return Counter()
    return Counter(tuple(None if pd.isna(v) else (int(v) if isinstance(v, float) and v.is_integer() else v)
                         for v in row) for row in frame[list(columns)].itertuples(index=False))


def read_with(reader: str, spark, directory: str | os.PathLike, fmt: str, columns: Sequence[str],
              schema: str | None = None, batches: bool = False) -> Counter:
    """The multiset of ``columns`` tuples ``reader`` finds in the sink directory ``directory``
    (``batches``: the update-mode layout, ``DIR/batch_id=N/``, read with its ``batch_id`` column)."""
    d = os.fspath(directory)
    pattern = os.path.join(d, *(["batch_id=*"] if batches else []), f"*.{_EXT[fmt]}")
    if reader == "spark":
        df = spark.read.format(fmt)
        if schema is not None:
            df = df.schema(schema)
        try:
            return Counter(tuple(r) for r in df.load(d).select(*columns).collect())
        except AnalysisException as exc:
            if "UNABLE_TO_INFER_SCHEMA" in str(exc):  # no file yet
                return Counter()
            raise
    if reader == "pandas":
        if fmt == "parquet":
            frame = pd.read_parquet(d)
        else:
            files = sorted(glob.glob(pattern))
            frame = (pd.concat([pd.read_json(f, lines=True, dtype=False).assign(
                **({"batch_id": int(f.split("batch_id=")[1].split("/")[0])} if batches else {})) for f in files])
                if files else pd.DataFrame(columns=list(columns)))
        return _records(frame, columns)
    if reader == "pyarrow":
        return _records(ds.dataset(d, format=fmt, partitioning="hive" if batches else None).to_table().to_pandas(),
                        columns)
    if reader == "duckdb":
        if not glob.glob(pattern):
            return Counter()
        fn = "read_parquet" if fmt == "parquet" else "read_json_auto"
        hive = ", hive_partitioning = true" if batches else ""
        return _records(duckdb.sql(f"SELECT * FROM {fn}('{pattern}'{hive})").df(), columns)
    raise ValueError(reader)


def read_everywhere(spark, directory: str | os.PathLike, fmt: str, columns: Sequence[str],
                    schema: str | None = None, batches: bool = False) -> dict[str, Counter]:
    """:func:`read_with` for every reader of :data:`READERS`."""
    return {r: read_with(r, spark, directory, fmt, columns, schema, batches) for r in READERS}
