"""What a ``map_batches_with_state`` function receives (:class:`StateBatch`) and returns
(:class:`StateUpdate`). The rules that turn its answer into state writes are
:class:`sparkstate.engines.batch_rules.BatchRules`, shared by the Spark engine and the no-Spark
harness (:class:`sparkstate.testing.BatchStateHarness`), so the two cannot drift apart.

The rules (docs/vectorized.md), mirroring ``GroupState``'s:

- ``batch.state`` has one row per key of the call: first the keys with new rows (in the order
  their rows appear in ``batch.rows``), then the keys whose timeout is due (strictly behind the
  clock) and that have no new rows, earliest timeout first (``timed_out`` true; chosen and
  ordered by :func:`sparkstate.engines.rules.due_keys`).
- A key in ``StateUpdate.state`` gets that state. Its pending timeout becomes the row's
  ``timeout_ms`` when the frame has that column (null: none); without the column, a key with
  new rows keeps its pending timeout and a timed-out key has none (a timeout fires once).
- A key in ``StateUpdate.remove`` loses its state and its timeout.
- A key in neither keeps its state and its timeout, except a timed-out key: it is removed
  (as ``GroupState`` without ``keep_expired_state``: state never outlives its timeout unless the
  function sets it again).
- Only the keys of ``batch.state`` may be set or removed; a key may not be both; ``timeout_ms``
  must be later than the processing time (``ProcessingTimeTimeout``), not before the watermark
  (``EventTimeTimeout``), and null without a timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

#: Columns of ``batch.state`` beside the key columns and the state's fields.
EXISTS = "exists"
TIMEOUT = "timeout_ms"
TIMED_OUT = "timed_out"
BOOKKEEPING = (EXISTS, TIMEOUT, TIMED_OUT)


@dataclass(frozen=True)
class StateBatch:
    """What a ``map_batches_with_state`` function gets, once per bucket of keys and micro-batch.

    ``rows``: the new input rows of this call's keys (all input columns; a key's rows together,
    in arrival order). ``state``: one row per key of the call: the key column(s), the state's
    fields (a primitive state: ``value``), ``exists``, ``timeout_ms`` (pending timeout, nullable
    ``Int64``), ``timed_out``. ``watermark_ms``: the batch's event-time watermark (-1 when the
    input has none). ``processing_time_ms``: the batch's processing time. ``key_index``: for each
    row of ``rows``, the position of its key's row in ``state`` (a numpy int array), to aggregate
    rows per key without a join: ``np.bincount(batch.key_index, minlength=len(batch.state))``.
    """

    rows: "pd.DataFrame"
    state: "pd.DataFrame"
    watermark_ms: int
    processing_time_ms: int
    key_index: Any = None


@dataclass(frozen=True)
class StateUpdate:
    """What a ``map_batches_with_state`` function returns (every part optional).

    ``state``: key column(s) + the state's fields (+ optional ``timeout_ms``) for the keys whose
    state is set; ``batch.state``'s ``exists`` and ``timed_out`` columns may stay, they are
    ignored. ``remove``: the keys whose state goes, as a DataFrame with the key column(s) or a
    list (of scalars; of tuples for several key columns). ``output``: a DataFrame with
    ``output_type``'s columns.
    """

    state: Any = None
    remove: Any = None
    output: Any = None
