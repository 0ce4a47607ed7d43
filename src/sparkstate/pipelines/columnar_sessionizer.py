"""Event-time sessionize over a bucket of keys at a time: the :class:`~.sessionizer.Sessionizer`'s
rules as column operations (:class:`SessionLogic`, the plan's :class:`~sparkstate.engines.base.BucketLogic`).

The per-key sessionizer sorts each key's pending and new events and splits them into sessions
in a Python loop, once per key and micro-batch. :class:`SessionLogic` does the same for all the
keys of a call in one pass (:func:`split_sessions`): the keys' stored open sessions are laid end
to end beside the call's new rows, the events are sorted by (key, time, flag, data), a session
starts where the key changes, after a flagged event or after more than ``gap``, and each key's
final sessions (a prefix of its sessions) are emitted while the rest become its new state.
State type (:class:`~.sessionizer.OpenSession`), timeouts and output rows are the per-key
sessionizer's, exactly, so a checkpoint written by either goes on under the other.

It runs event-time sessionize on a stream, in every shape (``late="drop"`` or ``"emit"``,
``carry``, ``emit_on_last``, ``event_time_column``), wherever an engine calls a bucket of keys
at a time; it sees only the columns of the call (:class:`~sparkstate.engines.base.BucketCall`)
and returns outputs and state writes, never touching storage. The rows ``late="emit"``
refuses are few; they go through the Sessionizer's own ``refusal`` and ``rejected_row``, as
:class:`~.sessionizer.SessionRow` records.
"""

from __future__ import annotations

from itertools import chain, compress
from operator import itemgetter
from typing import Any

import numpy as np

from ..engines.base import BucketCall, BucketLogic, BucketResult
from .sessionizer import CARRY, DATA, LAST, REASON, TIME, OpenSession, SessionRow, Sessionizer

#: OpenSession's fields, in the order its state columns hold them.
_FIELDS = ("start_ms", "end_ms", "events", "times", "sizes", "closed")
def split_sessions(pos: np.ndarray, t: np.ndarray, last: np.ndarray, data: Any, gap: int,
                   watermark: int) -> dict[str, Any]:
    """Sort the events of many keys (``pos``: each event's key number; ``t``: epoch ms; ``last``:
    its flag; ``data``: a list or an Arrow string array) as the per-key sessionizer sorts a key's events, split them into sessions
    and tell which are final at ``watermark``.

    Returns the events in order (``t``, ``data``) and per session (in order): ``start``/``end``
    (event index range), ``key``, ``closed`` (ends with a flag), ``due`` (when it becomes final:
    its GroupState timeout) and ``final``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(pos)
    d = data if isinstance(data, pa.Array) else pa.array(data, pa.string())
    # time, an unflagged event before a flagged one at the same time, then data (null first), as
    # Python orders the per-key sessionizer's (time, flag, data) tuples: UTF-8 bytes sort as code points
    order = pc.sort_indices(
        pa.table({"k": pos, "t": t, "l": last, "p": pc.is_valid(d), "d": pc.fill_null(d, "")}),
        sort_keys=[("k", "ascending"), ("t", "ascending"), ("l", "ascending"), ("p", "ascending"),
                   ("d", "ascending")]).to_numpy()
    pos, t, last = pos[order], t[order], last[order]
    data = d.take(pa.array(order)).to_pylist()
    if n == 0:
        none = np.zeros(0, np.int64)
        return {"t": t, "data": [], "start": none, "end": none, "key": pos, "closed": last, "due": none,
                "final": np.zeros(0, bool)}
    new = np.ones(n, bool)
    if n > 1:
        new[1:] = (pos[1:] != pos[:-1]) | last[:-1] | (t[1:] - t[:-1] > gap)
    start = np.flatnonzero(new)
    end = np.append(start[1:], n).astype(np.int64)
    key = pos[start]
    closed = last[end - 1]
    due = np.where(closed, t[end - 1] - 1, t[end - 1] + gap)
    # final once no event that is not late can change it; only a key's leading final sessions are
    # emitted (sessions after an open one wait for it)
    final = due < watermark
    first_of_key = np.ones(len(start), bool)
    first_of_key[1:] = key[1:] != key[:-1]
    open_so_far = np.cumsum(~final)
    open_before_key = np.maximum.accumulate(np.where(first_of_key, open_so_far - ~final, 0))
    final &= open_so_far == open_before_key
    return {"t": t, "data": data, "start": start, "end": end, "key": key, "closed": closed, "due": due,
            "final": final}


class SessionLogic(BucketLogic):
    """Event-time sessionize over a bucket of keys (see the module doc): ``sessionizer``'s
    settings and rules; ``output_names``: the output columns."""

    def __init__(self, sessionizer: Sessionizer, output_names: list[str]) -> None:
        self.sessionizer = sessionizer
        self.gap_ms = sessionizer.gap_ms
        self.output_names = list(output_names)

    # -- the call's rows as columns -----------------------------------------------------------------
    @staticmethod
    def _times(table: Any) -> tuple[np.ndarray, np.ndarray]:
        """Each row's time in epoch ms (floored, as the per-key path floors it) and whether it is null."""
        import pyarrow as pa

        ts = table.column(TIME)
        per_s = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[ts.type.unit]
        null_t = ts.is_null().to_numpy()
        ms = ts.cast(pa.int64()).fill_null(0).to_numpy()
        return (ms // (per_s // 1000) if per_s >= 1000 else ms * (1000 // per_s)), null_t

    def _refuse(self, call: BucketCall, keep: np.ndarray, refused: np.ndarray) -> tuple[list, list]:
        """late="emit": the refused rows as output rows, by the per-key sessionizer's own rules
        (they are few), with their keys."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_type

        from ..engines.row_values import arrow_column_converter

        table = call.rows.take(pa.array(np.flatnonzero(refused)))
        n_carry = self.sessionizer.n_carry
        cols = [arrow_column_converter(from_arrow_type(table.column(i).type))(table.column(i))
                for i in range(min(table.num_columns, CARRY + n_carry))]
        keys = [call.keys[i] for i in call.key_index[refused].tolist()]
        wm = call.watermark_ms
        rows: list = []
        for k, values in zip(keys, zip(*cols)):
            row = SessionRow(k, values[TIME], values[DATA], values[LAST], values[REASON], values[CARRY:])
            reason = self.sessionizer.refusal(row, wm)
            assert reason is not None, "a refused row has a reason"  # the rows were picked by their refusal
            rows.append(self.sessionizer.rejected_row(k, row, reason))
        return rows, keys

    # -- one call -----------------------------------------------------------------------------------
    def run(self, call: BucketCall) -> BucketResult:
        import pyarrow as pa
        import pyarrow.compute as pc

        keys = call.keys
        wm = call.watermark_ms
        table = call.rows
        rows: list = []
        row_keys: list = []
        r_pos = np.asarray(call.key_index, np.int64)
        r_t, null_t = self._times(table)
        r_last = pc.fill_null(table.column(LAST), False).to_numpy(zero_copy_only=False).astype(bool)
        r_data = table.column(DATA).combine_chunks()  # Arrow: it is sorted as Arrow (split_sessions)
        emit = self.sessionizer.emit
        refused = null_t | (r_t <= wm) if emit else null_t
        if emit:
            refused |= table.column(REASON).is_valid().to_numpy(zero_copy_only=False)
        if refused.any():
            kept = ~refused
            if emit:
                rows, row_keys = self._refuse(call, kept, refused)
            r_pos, r_t, r_last = r_pos[kept], r_t[kept], r_last[kept]
            r_data = r_data.filter(pa.array(kept))
        frames: list = []
        writes: dict = {}
        if keys:
            stored = call.states
            p_pos, p_t, p_last, p_data = _pending(stored)
            s = split_sessions(np.concatenate([p_pos, r_pos]), np.concatenate([p_t, r_t]),
                               np.concatenate([p_last, r_last]),
                               pa.concat_arrays([pa.array(p_data, r_data.type), r_data]), self.gap_ms, wm)
            out = s["final"]
            if self.sessionizer.emit_on_last:  # opt-in: a flag ends a session at once
                out = out | s["closed"]
            if out.any():
                frames.append(self._sessions_frame(keys, s, out))
            self._keep(keys, stored, call.timeouts, s, ~out, writes)
        return BucketResult(writes, frames, rows, row_keys)

    def _sessions_frame(self, keys: list, s: dict, emit: np.ndarray) -> Any:
        """The emitted sessions' output rows, as the per-key sessionizer's ``_session_row`` makes them."""
        import pandas as pd

        a, b = s["start"][emit], s["end"][emit]
        t, data = s["t"], s["data"]
        cols = [
            pd.Series([keys[i] for i in s["key"][emit].tolist()], dtype=object),
            pd.to_datetime(t[a], unit="ms", utc=True),  # session_start
            pd.to_datetime(t[b - 1], unit="ms", utc=True),  # session_end
            (b - a).astype(np.int64),  # event_count
            pd.Series([data[i:j] for i, j in zip(a.tolist(), b.tolist())], dtype=object),  # events
            np.where(s["closed"][emit], "last_event", "timeout").astype(object),  # closed_by
        ]
        if self.sessionizer.time_column:  # end + gap + 1 ms
            cols.append(pd.to_datetime(t[b - 1] + self.gap_ms + 1, unit="ms", utc=True))
        if self.sessionizer.emit:  # rejected: null on sessions
            cols.append(pd.Series([None] * len(a), dtype=object))
        return pd.DataFrame(dict(enumerate(cols))).set_axis(self.output_names, axis=1)

    def _keep(self, keys: list, stored: list, timeouts: list, s: dict, rest: np.ndarray, writes: dict) -> None:
        """Each key's sessions in ``rest`` become its state (timeout: the first one's due); a key left
        without any loses its entry."""
        key = s["key"][rest]
        a, b, closed, due = s["start"][rest], s["end"][rest], s["closed"][rest].tolist(), s["due"][rest].tolist()
        t, data = s["t"], s["data"]
        if self.sessionizer.emit_on_last:  # sessions emitted between kept ones: the kept events, end to end
            in_rest = np.repeat(rest, s["end"] - s["start"])
            t, data = t[in_rest], list(compress(data, in_rest.tolist()))
            b = np.cumsum(b - a)
            a = b - (s["end"][rest] - s["start"][rest])
        t = t.tolist()
        sizes = (b - a).tolist()
        # each key's run of open sessions: sessions f:e, events x:y
        k_first = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1]))) if len(key) else key
        k_end = np.append(k_first[1:], len(key)).astype(np.int64)[: len(k_first)]
        runs = zip(key[k_first].tolist(), k_first.tolist(), k_end.tolist(), a[k_first].tolist(),
                   b[k_end - 1].tolist())
        for i, f, e, x, y in runs:
            writes[keys[i]] = ((t[x], t[y - 1], data[x:y], t[x:y], sizes[f:e], closed[f:e]), due[f])
        gone = np.fromiter((c is not None or w is not None for c, w in zip(stored, timeouts)), bool, len(stored))
        gone[key] = False
        for i in np.flatnonzero(gone).tolist():
            writes[keys[i]] = None


def _pending(stored: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """The stored open sessions' events laid end to end: (key number, time ms, flag, data), key by
    key in session order (a closed session's last event carries the flag)."""
    at = [i for i, c in enumerate(stored) if c is not None and c[2]]
    live = [stored[i] for i in at]
    events, times, sizes, closed = (list(map(itemgetter(j), live)) for j in (2, 3, 4, 5))
    try:
        n_events, n_times, n_sizes, n_closed = (np.fromiter(map(len, col), np.int64, len(live))
                                                for col in (events, times, sizes, closed))
    except TypeError:  # a list field stored as None
        return _pending_each(stored)
    if not ((n_times == n_events).all() and (n_sizes > 0).all() and (n_closed == n_sizes).all()):
        return _pending_each(stored)
    pos = np.repeat(np.asarray(at, np.int64), n_events)
    t = np.fromiter(chain.from_iterable(times), np.int64, len(pos))
    data = list(chain.from_iterable(events))
    n = int(n_sizes.sum())
    ends = np.cumsum(np.fromiter(chain.from_iterable(sizes), np.int64, n))
    last = np.zeros(len(pos), bool)
    last[ends[np.fromiter(chain.from_iterable(closed), bool, n)] - 1] = True
    return pos, t, last, data


def _pending_each(states: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """:func:`_pending` key by key through :meth:`OpenSession.pending`, for a bucket holding a state of
    an earlier layout (no event times, or no sessions recorded)."""
    pos: list = []
    t: list = []
    last: list = []
    data: list = []
    for i, c in enumerate(states):
        if c is None or not c[2]:
            continue
        for ms, flag, d in OpenSession(*c).pending():
            pos.append(i)
            t.append(ms)
            last.append(flag)
            data.append(d)
    return np.array(pos, np.int64), np.array(t, np.int64), np.array(last, bool), data
