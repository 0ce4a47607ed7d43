"""How a row of an initial-state DataFrame (engine layout) becomes a stored key's entry.

One rule for both engines that pack keys into buckets (batched, and inband, which hashes keys as
batched does): the state is decoded
and encoded with the plan's codec (so a value the state type cannot hold is refused by name),
the pending timeout comes from the row's :data:`~.base.INITIAL_TIMEOUT_COLUMN`, and a key given
twice is refused, as Spark refuses duplicate keys in an initial state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

from ...errors import ConfigError, StateSchemaError
from ..base import INITIAL_TIMEOUT_COLUMN, StatePlan, initial_key_column
from ..rules import initial_timeout
from .layout import BUCKET_COLUMN, HASH_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def hashed(initial: "DataFrame", plan: StatePlan, buckets: int) -> "DataFrame":
    """``initial`` with each key's bucket and hash, as the input's keys get them (``xxhash64``)."""
    from pyspark.sql import functions as F

    h = F.xxhash64(*[F.col(initial_key_column(i)) for i in range(len(plan.key_columns))])
    return initial.select("*", F.pmod(h, F.lit(buckets)).cast("int").alias(BUCKET_COLUMN), h.alias(HASH_COLUMN))


class InitialEntries:
    """Turns initial-state rows (dicts, with the bucket and hash columns) into entries.

    Built on the driver from the plan and shipped to the workers (it keeps the plan, whose codec
    reaches the worker guarded)."""

    def __init__(self, plan: StatePlan) -> None:
        self.plan = plan
        self.key_columns = [initial_key_column(i) for i in range(len(plan.key_columns))]
        self.fields = list(plan.state_codec.fields)

    def key_of(self, row: dict) -> Any:
        cols = self.key_columns
        return row[cols[0]] if len(cols) == 1 else tuple(row[c] for c in cols)

    def rows(self, rows: Iterable[dict]) -> Iterator[tuple[int, Any, list]]:
        """``(bucket, key, [state columns, pending timeout, key hash])`` per row."""
        plan = self.plan
        codec = plan.state_codec
        has_timeout = plan.initial_has_timeout
        for r in rows:
            k = self.key_of(r)
            try:
                cols = codec.encode_columns(codec.decode_columns(tuple(r[f] for f in self.fields)))
            except Exception as exc:
                raise StateSchemaError(f"{plan.operator}: the initial state of key {k!r} cannot be stored: {exc}") from None
            t = initial_timeout(plan.timeout, r.get(INITIAL_TIMEOUT_COLUMN) if has_timeout else None, None, 0)
            yield r[BUCKET_COLUMN], k, [cols, t, r[HASH_COLUMN]]

    def add(self, entries: dict, key: Any, entry: list) -> None:
        """Put ``entry`` under ``key``, refusing a key the initial state gave before."""
        if key in entries:
            raise ConfigError(f"{self.plan.operator}: initial_state holds key {key!r} more than once; give each key"
                              " one row (Spark refuses duplicate keys in an initial state)")
        entries[key] = entry
