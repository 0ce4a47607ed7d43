"""How the inband engine stores state, and how the state tools read it back.

Keys are hashed (``xxhash64`` of the key columns, as the batched engine does) into ``buckets``
buckets; the bucket is ``applyInPandasWithState``'s grouping key, so Spark's own state store
keeps ONE state row per bucket, reads it and writes it itself, and ships it to Python in-band
with the bucket's input rows (no request per key or per bucket).

That row has one binary column, :data:`STATE_COLUMN`: a pickle of
``(version, buckets, fields, key_schema, state_schema, entries)``, where ``entries`` maps each
key of the bucket to ``[state columns, pending timeout, key hash]`` (the batched engine's leaf
entries), ``fields`` names the state columns (for evolution) and the two schemas are the JSON of
the key's and the state's Spark types, for the state tools. The bucket's own Spark timeout is the
earliest pending timeout of its keys.

A batch rewrites every bucket it touches whole: its cost follows the size of the touched
buckets (the keys in state over ``buckets``), not only the keys touched.
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import BinaryType, StructField, StructType

from ...errors import StateSchemaError
from ..base import PICKLE_PROTOCOL, StoredLayout, decoded_records
from ..state_fields import relayer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ENGINE = "inband"
LAYOUT_VERSION = 1
#: The one column of the per-bucket state row; its name marks a checkpoint as this engine's.
STATE_COLUMN = "sparkstate_inband"
STATE_SCHEMA = StructType([StructField(STATE_COLUMN, BinaryType(), True)])
#: Spark's name for the operator applyInPandasWithState plans (in ``state-metadata``, 4.0 and later).
SPARK_OPERATOR = "applyInPandasWithState"
#: Where Spark's state reader puts the group state in each row's ``value``.
GROUP_STATE = "groupState"
BLOB_PATH = f"value.{GROUP_STATE}.{STATE_COLUMN}"


@dataclass
class Bucket:
    """One bucket's state: every key's entry, and what the entries were written with."""

    buckets: int
    fields: tuple[str, ...]
    key_schema: str
    state_schema: str
    entries: dict

    def dumps(self) -> bytes:
        return pickle.dumps((LAYOUT_VERSION, self.buckets, self.fields, self.key_schema, self.state_schema,
                             self.entries), PICKLE_PROTOCOL)

    @staticmethod
    def loads(blob: bytes) -> "Bucket":
        version, *rest = pickle.loads(blob)
        if version != LAYOUT_VERSION:
            raise StateSchemaError(
                f"inband engine: state layout version {version} is not supported (expected {LAYOUT_VERSION})")
        buckets, fields, key_schema, state_schema, entries = rest
        return Bucket(buckets, tuple(fields), key_schema, state_schema, entries)

    def earliest(self) -> int | None:
        """The earliest pending timeout of the bucket's keys."""
        times = [e[1] for e in self.entries.values() if e[1] is not None]
        return min(times) if times else None


def stored_layout(spark: Any, checkpoint: str, operator: dict[str, Any]) -> StoredLayout | None:
    """The inband layout of an operator's state (by the state row's column), or None.

    ``operator["operator"]`` is ``None`` on PySpark 3.5, which records no operator names: the
    state row's column alone tells this engine's state there, and names the operator.
    """
    if operator["operator"] not in (SPARK_OPERATOR, None):
        return None
    if operator["operator"] is None:
        operator = {**operator, "operator": SPARK_OPERATOR}
    layout = Layout1(spark, checkpoint, operator)
    value = layout.state_row_schema()
    group = value[GROUP_STATE].dataType if GROUP_STATE in value.names else None
    if isinstance(group, StructType) and STATE_COLUMN in group.names:
        return layout
    return None


class Layout1(StoredLayout):
    engine = ENGINE
    version = LAYOUT_VERSION

    def _buckets(self, batch_id: int | None) -> list[Bucket]:
        rows = self.state_rows(batch_id).select(BLOB_PATH).collect()
        return [Bucket.loads(r[0]) for r in rows if r[0] is not None]

    @staticmethod
    def _schemas(buckets: list[Bucket]) -> tuple[StructType, StructType]:
        """The key and state schemas most buckets were last written with."""
        if not buckets:
            raise StateSchemaError("the checkpoint's state is empty (no key was ever stored)")
        key_json = Counter(b.key_schema for b in buckets).most_common(1)[0][0]
        state_json = Counter(b.state_schema for b in buckets).most_common(1)[0][0]
        return StructType.fromJson(json.loads(key_json)), StructType.fromJson(json.loads(state_json))

    def schema(self) -> tuple[StructType, StructType]:
        return self._schemas(self._buckets(None))

    def settings(self) -> dict[str, Any]:
        """The bucket count the checkpoint was created with (each bucket's row records it)."""
        counts = {b.buckets for b in self._buckets(None)}
        return {"buckets": counts.pop()} if len(counts) == 1 else {}

    def schemas(self) -> tuple[StructType, list[StructType]]:
        buckets = self._buckets(None)
        key, _ = self._schemas(buckets)
        seen = dict.fromkeys(b.state_schema for b in buckets)
        return key, [StructType.fromJson(json.loads(j)) for j in seen]

    def records(self, batch_id: int | None) -> "DataFrame":
        from pyspark.sql import functions as F

        key_schema, state_schema = self._schemas(self._buckets(batch_id))
        target = state_schema
        single = len(key_schema.fields) == 1
        fits: dict[str, Any] = {}

        def decode(row: Any) -> Any:
            if row[0] is None:
                return
            b = Bucket.loads(row[0])
            fit = fits.get(b.state_schema)
            if fit is None:
                fit = fits[b.state_schema] = relayer(StructType.fromJson(json.loads(b.state_schema)), target)
            for k, (cols, timeout, _h) in b.entries.items():
                if cols is not None:
                    cols = fit(cols)
                yield (row[1], (k,) if single else tuple(k), cols, timeout, cols is not None)

        rows = self.state_rows(batch_id).select(F.col(BLOB_PATH).alias("blob"), "partition_id")
        return decoded_records(rows, decode, key_schema, state_schema)
