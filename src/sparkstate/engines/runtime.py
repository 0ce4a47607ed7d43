"""What the installed PySpark offers the engines: its stateful processor base class, Arrow types,
Arrow collection; which minor has what is :mod:`sparkstate.versions` (re-exported here).
"""

from __future__ import annotations

from typing import Any

from ..versions import (  # noqa: F401  (re-exported: the engines and the jobs read them from here)
    OBSERVED_WITHOUT_INPUT, PYTHON_UNIX_SOCKETS, STATE_READERS, TRANSFORM_WITH_STATE_IN_PANDAS,
    TRANSFORM_WITH_STATE_ROWS, has, minor_of, pyspark_minor, require,
)

try:
    from pyspark.sql.streaming import StatefulProcessor
except ImportError:  # PySpark 3.5: the engines on transformWithState refuse to run there (require)
    class StatefulProcessor:  # type: ignore[no-redef]
        """What the tws and batched engines' processors derive from where PySpark has none."""


def arrow_type(dt: Any) -> Any:
    """The Arrow type of the Spark type ``dt``, timestamps as UTC instants (PySpark 4.1 and later
    take ``timezone=``; 4.0 and 3.5 have none, their timestamps are always UTC)."""
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return to_arrow_type(dt, timezone="UTC")
    except TypeError:
        return to_arrow_type(dt)


def collect_arrow(df: Any) -> Any:
    """``df``'s rows on the driver as one pyarrow Table in Spark's Arrow types (``toArrow``: 4.0
    and later; on 3.5 from the Arrow batches ``toPandas`` is built from, with ``df``'s schema)."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    import pyarrow as pa

    schema = pa.schema([pa.field(f.name, arrow_type(f.dataType), f.nullable) for f in df.schema.fields])
    batches = df._collect_as_arrow()  # PySpark 3.5's own (toArrow came in 4.0)
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
