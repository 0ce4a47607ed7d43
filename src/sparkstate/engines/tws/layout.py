"""How the tws engine stores a key's state, and how the state tools read it back.

Layout 2 (this release): one value-state variable ``sparkstate_v2``, one row per key, of the
fixed schema :data:`STATE_ROW_SCHEMA` whatever the state type: the type tag of the state's
columns (``type_tags.type_tag``), the columns' values pickled as one tuple, the pending timeout.
Spark therefore sees the same value schema under either state encoding (``unsaferow`` allows no
schema change, ``avro`` evolves it itself) and the state's evolution is ours: a row whose tag
differs from the query's is re-laid by field name when read.

Layout 1 (earlier releases): variable ``sparkstate`` holding the state's fields as Spark columns
beside :data:`LEGACY_EXISTS_COLUMN` and :data:`LEGACY_TIMEOUT_COLUMN`; it needed Avro for
evolution. It is read by the state tools and refused as a checkpoint to run on.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from ..base import EXISTS_COLUMN, INITIAL_TIMEOUT_COLUMN, StoredLayout, decoded_records, struct_column
from ..state_fields import relayer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ENGINE = "tws"
STATE_VARIABLE = "sparkstate_v2"
LEGACY_STATE_VARIABLE = "sparkstate"
LEGACY_EXISTS_COLUMN = "_sparkstate_exists"
LEGACY_TIMEOUT_COLUMN = "_sparkstate_timeout_ms"
#: Columns of a layout-2 state row: the type tag of the state's columns, the encoded state
#: (null when only a timeout is pending), the timeout.
SCHEMA_FIELD = "schema"
STATE_FIELD = "state"
TIMEOUT_FIELD = "timeout_ms"
STATE_ROW_SCHEMA = StructType([
    StructField(SCHEMA_FIELD, StringType(), True),
    StructField(STATE_FIELD, BinaryType(), True),
    StructField(TIMEOUT_FIELD, LongType(), True),
])
#: What a layout-2 query opens under the layout-1 name and never writes: a layout-1 checkpoint
#: holds ``_sparkstate_exists`` as a boolean there, which Spark cannot evolve to binary under
#: either encoding, so such a checkpoint is refused when the query starts instead of its state
#: being silently ignored (with ``checkpoint=``, :meth:`Layout1.restart_refusal` refuses it
#: earlier, in words).
LEGACY_GUARD_SCHEMA = StructType([StructField(LEGACY_EXISTS_COLUMN, BinaryType(), True)])


def stored_layout(spark: Any, checkpoint: str, operator: dict[str, Any]) -> StoredLayout | None:
    """The tws layout of an operator's state (by its state variables), or None."""
    names = operator["state_variables"]
    if STATE_VARIABLE in names:
        return Layout2(spark, checkpoint, operator)
    if LEGACY_STATE_VARIABLE in names:
        return Layout1(spark, checkpoint, operator)
    return None


class Layout2(StoredLayout):
    engine = ENGINE
    version = 2

    def _state_types(self, raw: "DataFrame") -> dict[str, int]:
        """Each state type tag found in the rows, with its number of keys."""
        return {r[0]: r[1] for r in raw.groupBy(f"value.{SCHEMA_FIELD}").count().collect() if r[0] is not None}

    def records(self, batch_id: int | None) -> "DataFrame":
        from pyspark.sql import functions as F

        from .type_tags import parse_struct_tag, parse_type_tag

        raw = self.variable(STATE_VARIABLE, batch_id)
        key_schema = struct_column(raw.schema, "key")
        tags = self._state_types(raw)
        target_tag = max(tags, key=lambda t: (tags[t], t)) if tags else "struct<>"
        target = parse_struct_tag(target_tag)
        relayers = {t: relayer(parse_type_tag(t), target) for t in tags if t != target_tag}

        def decode(row: tuple) -> Any:
            part, tag, blob, timeout, *key = row
            cols = None
            if blob is not None:
                cols = pickle.loads(blob)
                if tag != target_tag:
                    cols = relayers[tag](cols)
            yield (part, tuple(key), cols, timeout, cols is not None)

        rows = raw.select("partition_id", *[F.col(f"value.`{f}`").alias(f) for f in (SCHEMA_FIELD, STATE_FIELD, TIMEOUT_FIELD)],
                          *[F.col(f"key.`{k}`").alias(f"_k{i}") for i, k in enumerate(key_schema.names)])
        return decoded_records(rows, decode, key_schema, target)

    def schemas(self) -> tuple[StructType, list[StructType]]:
        from .type_tags import parse_struct_tag

        raw = self.variable(STATE_VARIABLE, None)
        return struct_column(raw.schema, "key"), [parse_struct_tag(t) for t in sorted(self._state_types(raw))]


class Layout1(StoredLayout):
    engine = ENGINE
    version = 1

    def records(self, batch_id: int | None) -> "DataFrame":
        from pyspark.sql import functions as F

        raw = self.variable(LEGACY_STATE_VARIABLE, batch_id)
        meta = (LEGACY_EXISTS_COLUMN, LEGACY_TIMEOUT_COLUMN)
        fields = [f for f in struct_column(raw.schema, "value").names if f not in meta]
        return raw.select(
            "partition_id", "key",
            F.struct(*[F.col(f"value.`{f}`").alias(f) for f in fields]).alias("value"),
            F.col(f"value.`{LEGACY_TIMEOUT_COLUMN}`").alias(INITIAL_TIMEOUT_COLUMN),
            F.col(f"value.`{LEGACY_EXISTS_COLUMN}`").alias(EXISTS_COLUMN),
        )

    def schemas(self) -> tuple[StructType, list[StructType]]:
        key, state = self.schema()
        return key, [state]

    def restart_refusal(self) -> str | None:
        return (
            "was written by an earlier sparkstate release, which kept the"
            " state's fields as Spark columns (and needed the Avro state encoding); this release keeps each key's"
            " state in one encoded row, which works under either encoding and beside Spark's own stateful"
            " operators. Move the state: export it (`sparkstate state export CHECKPOINT state.parquet` or"
            " ss.state.export) and start the query on a new checkpoint with"
            " initial_state=spark.read.parquet(\"state.parquet\")."
        )
