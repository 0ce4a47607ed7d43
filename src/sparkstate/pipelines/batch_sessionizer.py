"""Event-time sessionize over a whole bucket at once: the :class:`~.sessionizer.Sessionizer`'s
rules as column operations, run by the batched engine in place of its per-key loop.

The per-key sessionizer sorts each key's pending and new events and splits them into sessions
in a Python loop, once per key and micro-batch. :class:`SessionProcessor` does the same for all
the keys of a bucket in one pass (:func:`split_sessions`): the open sessions stored in the
bucket's leaves are laid end to end beside the batch's new rows, the events are sorted by
(key, time, flag, data), a session starts where the key changes, after a flagged event or after
more than ``gap``, and each key's final sessions (a prefix of its sessions) are emitted while
the rest become its new state. Leaves, directory, timers, state type
(:class:`~.sessionizer.OpenSession`), timeouts and output rows are the per-key path's, exactly,
so a checkpoint written by either goes on under the other.

It runs event-time sessionize on a stream, in every shape (``late="drop"`` or ``"emit"``,
``carry``, ``emit_on_last``, ``event_time_column``; the Sessionizer names it as its
``_sparkstate_processor``), on packed input or row by row. The rows ``late="emit"`` refuses are
few; they go through the Sessionizer's own ``_refused``/``_rejected``. A call whose input it does
not read as columns (timestamps in a session time zone other than UTC, row by row) goes through
the per-key loop (:class:`~sparkstate.engines.batched.processor.BucketProcessor`), which reads and
writes the same leaves.
"""

from __future__ import annotations

from itertools import chain, compress
from operator import itemgetter
from typing import Any, Iterator

import numpy as np

from ..engines.batched.grouping import gc_paused
from ..engines.batched.processor import BucketProcessor
from .sessionizer import OpenSession

#: OpenSession's fields, in the order its state columns hold them.
_FIELDS = ("start_ms", "end_ms", "events", "times", "sizes", "closed")


def split_sessions(pos: np.ndarray, t: np.ndarray, last: np.ndarray, data: list, gap: int,
                   watermark: int) -> dict[str, Any]:
    """Sort the events of many keys (``pos``: each event's key number; ``t``: epoch ms; ``last``:
    its flag; ``data``) as the per-key sessionizer sorts a key's events, split them into sessions
    and tell which are final at ``watermark``.

    Returns the events in order (``t``, ``data``) and per session (in order): ``start``/``end``
    (event index range), ``key``, ``closed`` (ends with a flag), ``due`` (when it becomes final:
    its GroupState timeout) and ``final``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(pos)
    d = pa.array(data, pa.string())
    # time, an unflagged event before a flagged one at the same time, then data (null first), as
    # Python orders the per-key sessionizer's (time, flag, data) tuples: UTF-8 bytes sort as code points
    order = pc.sort_indices(
        pa.table({"k": pos, "t": t, "l": last, "p": pc.is_valid(d), "d": pc.fill_null(d, "")}),
        sort_keys=[("k", "ascending"), ("t", "ascending"), ("l", "ascending"), ("p", "ascending"),
                   ("d", "ascending")]).to_numpy()
    pos, t, last = pos[order], t[order], last[order]
    data = d.take(pa.array(order)).to_pylist()
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


class SessionProcessor(BucketProcessor):
    """The batched engine's processor for event-time sessionize on a stream (see the module doc)."""

    def init(self, handle: Any) -> None:
        super().init(handle)
        func = self.plan.func
        self.func = func
        self.gap_ms = func.gap_ms
        self.key_at = self.input.key_pos[0]
        # the Sessionizer's rows: (key, timestamp, data, last_flag), then with emit the reason
        self.ts_at, self.data_at, self.last_at, self.reason_at = 1, 2, 3, 4
        utc = self.tz.upper() in ("UTC", "Z", "GMT", "ETC/UTC")
        self.columnar = (tuple(self.plan.state_codec.fields) == _FIELDS and len(self.plan.key_columns) == 1
                         and (self.packed or utc))

    # -- the bucket's input as columns ------------------------------------------------------------
    def _read(self, frames: list) -> dict | None:
        """The bucket's rows as columns: each row's key (as the function would see it), key hash,
        time (epoch ms, floored as the per-key path floors it), null time, flag, data and (late="emit")
        whether SQL refused it, and ``rows(mask)``: the masked rows as the per-key path builds them.
        None when the rows are not what this path reads (then the per-key loop runs)."""
        conv = self.input.converters
        if self.packed:
            import pyarrow as pa

            tables = self.input.packed_tables(frames)
            if not tables:
                return None
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            ts, flag = table.column(self.ts_at), table.column(self.last_at)
            if not pa.types.is_timestamp(ts.type) or flag.null_count or not pa.types.is_boolean(flag.type):
                return None
            per_s = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[ts.type.unit]
            null_t = ts.is_null().to_numpy()
            ms = ts.cast(pa.int64()).fill_null(0).to_numpy()
            ms = ms // (per_s // 1000) if per_s >= 1000 else ms * (1000 // per_s)  # floored, as _floor_ms

            def column(i: int) -> Any:
                return table.column(i)

            def rows(mask: np.ndarray) -> tuple[list, list]:
                idx = pa.array(np.flatnonzero(mask))
                return self.input._keys_and_rows([c(table.column(i).take(idx)) for i, c in enumerate(conv)])

            out = {"hash": table.column(self.input.hash_pos).to_numpy(), "last": flag.to_numpy()}
        else:
            import pandas as pd

            pdf = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            ts, flag = pdf.iloc[:, self.ts_at], pdf.iloc[:, self.last_at]
            if ts.dtype.kind != "M" or getattr(ts.dt, "tz", None) is not None or flag.dtype.kind != "b":
                return None
            null_t = ts.isna().to_numpy()
            ms = ts.to_numpy("datetime64[ns]").view(np.int64) // 1_000_000

            def column(i: int) -> Any:
                return pdf.iloc[:, i]

            def rows(mask: np.ndarray) -> tuple[list, list]:
                return self.input._keys_and_rows([c(pdf.iloc[mask, i]) for i, c in enumerate(conv)])

            out = {"hash": pdf.iloc[:, self.input.hash_pos].to_numpy(np.int64), "last": flag.to_numpy(bool)}
        if null_t.any() and not self.func.emit:
            return None
        out.update(key=conv[self.key_at](column(self.key_at)), t=ms, null_t=null_t,
                   data=conv[self.data_at](column(self.data_at)), rows=rows)
        if self.func.emit:
            refused = column(self.reason_at)
            out["reason"] = refused.is_valid().to_numpy() if self.packed else refused.notna().to_numpy()
        return out

    def _refuse(self, cols: dict, wm: int) -> tuple[list, list]:
        """late="emit": the rows that cannot join a session, taken out of ``cols`` and turned into
        output rows by the per-key sessionizer's own rules (they are few), with their keys (as
        :meth:`frame` names them in errors)."""
        refused = cols["reason"] | cols["null_t"] | (cols["t"] <= wm)
        if not refused.any():
            return [], []
        keys, rows = cols["rows"](refused)
        out = [self.func._rejected(k, r, self.func._refused(r, wm)) for k, r in zip(keys, rows)]
        kept = ~refused
        keep = kept.tolist()
        for name in ("hash", "t", "last"):
            cols[name] = cols[name][kept]
        for name in ("key", "data"):
            cols[name] = list(compress(cols[name], keep))
        return out, [(i + 1, k) for i, k in enumerate(keys)]

    @staticmethod
    def _numbered(cols: dict) -> tuple:
        """(keys in first-seen order, their hashes, each row's key number, time ms, flag, data)."""
        number: dict = {}
        row_keys = cols["key"]
        pos = np.fromiter((number.setdefault(k, len(number)) for k in row_keys), np.int64, len(row_keys))
        _, first = np.unique(pos, return_index=True)  # each key's first row (key numbers are 0..n-1)
        return list(number), cols["hash"][first].tolist(), pos, cols["t"], cols["last"], cols["data"]

    # -- one call -----------------------------------------------------------------------------------
    def _process_columns(self, cols: dict | None, tv: Any) -> list:
        pt, wm = self.times(tv)
        now = self.now(pt, wm)
        seen = max(wm, 0) if self.plan.has_watermark else -1  # the watermark a GroupState shows
        out: list = []
        refused: list = []
        rows = None
        if cols is not None:
            if self.func.emit:
                refused, owners = self._refuse(cols, seen)
            if len(cols["t"]):
                rows = self._numbered(cols)
        store = self.store
        d = store.load_dir()
        keys, hashes, r_pos, r_t, r_last, r_data = rows or ([], [], np.zeros(0, np.int64), np.zeros(0, np.int64),
                                                             np.zeros(0, bool), [])
        lids, due, touched = store.touch(d, hashes, now)
        entries = [touched[lid].get(k) for k, lid in zip(keys, lids)]
        for k, h, lid, e in store.timed_out(touched, due, now, set(keys)):
            keys.append(k)
            hashes.append(h)
            lids.append(lid)
            entries.append(e)
        if keys:
            stored = [None if e is None else e[0] for e in entries]
            p_pos, p_t, p_last, p_data = _pending(stored)
            s = split_sessions(np.concatenate([p_pos, r_pos]), np.concatenate([p_t, r_t]),
                               np.concatenate([p_last, r_last]), p_data + r_data, self.gap_ms, seen)
            emit = s["final"]
            if self.func.emit_on_last:  # opt-in: a flag ends a session at once
                emit = emit | s["closed"]
            if emit.any():
                out.append(self._sessions_frame(keys, s, emit))
            self._keep(keys, hashes, lids, stored, touched, s, ~emit)
        store.commit(d, touched, now)
        if refused:
            out.append(self.frame(refused, owners))
        return out

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
        if self.func.time_column:  # end + gap + 1 ms
            cols.append(pd.to_datetime(t[b - 1] + self.gap_ms + 1, unit="ms", utc=True))
        if self.func.emit:  # rejected: null on sessions
            cols.append(pd.Series([None] * len(a), dtype=object))
        return pd.DataFrame(dict(enumerate(cols))).set_axis(list(self.plan.output_schema.names), axis=1)

    def _keep(self, keys: list, hashes: list, lids: list, stored: list, touched: dict, s: dict,
              rest: np.ndarray) -> None:
        """Each key's sessions in ``rest`` become its state (timeout: the first one's due); a key left
        without any loses its entry."""
        key = s["key"][rest]
        a, b, closed, due = s["start"][rest], s["end"][rest], s["closed"][rest].tolist(), s["due"][rest].tolist()
        t, data = s["t"], s["data"]
        if self.func.emit_on_last:  # sessions emitted between kept ones: the kept events, end to end
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
            touched[lids[i]][keys[i]] = [(t[x], t[y - 1], data[x:y], t[x:y], sizes[f:e], closed[f:e]), due[f],
                                         hashes[i]]
        gone = np.fromiter((c is not None for c in stored), bool, len(stored))
        gone[key] = False
        for i in np.flatnonzero(gone).tolist():
            touched[lids[i]].pop(keys[i], None)

    # -- the transformWithState callbacks ---------------------------------------------------------
    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        with gc_paused():
            frames = [f for f in rows if len(f)]
            cols = self._read(frames) if frames and self.columnar else None
            if frames and cols is None:
                groups, hashes = self.input.group(iter(frames))  # the per-key loop reads it
                return iter(self.process(groups, hashes, timerValues))
            return iter(self._process_columns(cols, timerValues))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        if not self.columnar:
            return super().handleExpiredTimer(key, timerValues, expiredTimerInfo)
        with gc_paused():
            return iter(self._process_columns(None, timerValues))


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
