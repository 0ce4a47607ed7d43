"""``sparkstate state show|stats|export`` (:mod:`sparkstate.state`) and ``sparkstate report``."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._terminal import send_process_output_to



def add_parser(sub: Any) -> None:
    """The ``state`` and ``report`` subcommands."""
    st = sub.add_parser("state", help="inspect, measure or export the state of a query's checkpoint")
    ops = st.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    show = ops.add_parser("show", help="each key's state, decoded, with its pending timeout")
    show.add_argument("checkpoint", help=_CHECKPOINT)
    _remote_flag(show)
    show.add_argument("--key", help="only this key (compared as text)")
    show.add_argument("--batch", type=int, help="as of this committed batch (default: the latest)")
    show.add_argument("--json", action="store_true", help="one JSON object per line")
    show.add_argument("--limit", type=int, default=100, help="rows to print (default: %(default)s; 0: all)")
    show.set_defaults(run=_show)
    stats = ops.add_parser("stats", help="keys and bytes per partition and batch, and the operator's metadata")
    stats.add_argument("checkpoint", help=_CHECKPOINT)
    _remote_flag(stats)
    stats.set_defaults(run=_stats)
    exp = ops.add_parser("export", help="write the state as Parquet, usable as --initial-state of a new query")
    exp.add_argument("checkpoint", help=_CHECKPOINT)
    exp.add_argument("path", help="the Parquet directory to write (replaced if present): one row per key, as"
                                  " `state show` lists it; a new query starts from it with `sparkstate run"
                                  " --initial-state PATH`")
    exp.add_argument("--batch", type=int, help="as of this committed batch (default: the latest)")
    _remote_flag(exp)
    exp.set_defaults(run=_export)

    rep = sub.add_parser("report", help="plots and a summary of a run's metrics file")
    rep.add_argument("metrics", help="the JSON-lines file of `sparkstate run --metrics`")
    rep.add_argument("--out", required=True, help="directory for the PNGs and summary.txt")
    rep.set_defaults(run=_report)


_CHECKPOINT = "the checkpoint directory of a sparkstate query (its --checkpoint or checkpointLocation)"


def _remote_flag(parser: Any) -> None:
    parser.add_argument("--remote", metavar="URL", default=os.environ.get("SPARKSTATE_REMOTE"),
                        help="read through a Spark Connect server, e.g. sc://HOST:15002 (default: SPARKSTATE_REMOTE,"
                             " else SPARK_REMOTE, else Spark started here)")


def _session(args: argparse.Namespace):
    """The session of a ``state`` command, started once what needs no Spark was checked."""
    from ..extras import require
    from ..spark import remote_url
    from ..state import check_local

    remote = remote_url(getattr(args, "remote", None))
    if remote is None:
        check_local(args.checkpoint)
    else:
        require("connect", f"state {args.state_command}: --remote {remote}")
    from pyspark.sql import SparkSession

    import sparkstate as ss

    if remote is None and SparkSession.getActiveSession() is None:
        # Spark starts here: its own output goes to a scratch log, removed when the command ends
        log_path = Path(tempfile.gettempdir()) / f"sparkstate-state-{os.getpid()}.log"
        send_process_output_to(log_path)
        atexit.register(log_path.unlink, missing_ok=True)
    return ss.spark_session("sparkstate-state", remote=remote)


def _plain(v: Any, name: str = "") -> Any:
    if isinstance(v, datetime):
        return v.astimezone(timezone.utc).isoformat()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if hasattr(v, "asDict"):
        return _plain(v.asDict())
    if isinstance(v, int) and name.endswith("_ms") and v > 10**11:
        return f"{v} ({datetime.fromtimestamp(v / 1000, tz=timezone.utc):%Y-%m-%d %H:%M:%S} UTC)"
    return v


def _show(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    import sparkstate as ss

    spark = _session(args)
    df = ss.state.read(spark, args.checkpoint, batch_id=args.batch)
    if args.key is not None:
        df = df.where(F.col(df.columns[0]).cast("string") == args.key)
    rows = df.collect() if not args.limit else df.limit(args.limit).collect()
    if args.json:
        for r in rows:
            print(json.dumps({k: _plain(v) for k, v in r.asDict().items()}, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    title = f"state of {args.checkpoint} ({len(rows)} keys shown)"
    if len(df.columns) <= _WIDE:
        table = Table(title=title)
        for c in df.columns:
            table.add_column(c)
        for r in rows:
            table.add_row(*[str(_plain(v, k)) for k, v in r.asDict().items()])
        console.print(table)
        return 0
    # A wide state (many fields, long lists) would be cut to the terminal's width: one
    # field-per-line table per key instead, values folded rather than truncated.
    console.print(title)
    for r in rows:
        table = Table(show_header=False)
        table.add_column("field", no_wrap=True)
        table.add_column("value", overflow="fold")
        for k, v in r.asDict().items():
            table.add_row(k, str(_plain(v, k)))
        console.print(table)
    return 0


#: Above this many columns `state show` prints one table per key (field, value) instead of one row per key.
_WIDE = 5


def _stats(args: argparse.Namespace) -> int:
    import sparkstate as ss

    st = ss.state.stats(_session(args), args.checkpoint)
    op = st.operator
    print(f"checkpoint: {st.checkpoint}")
    print(_operator_line(op))
    settings = "".join(f", {k} {v}" for k, v in sorted(st.layout_settings.items()))
    print(f"layout: {op.get('engine')} engine, version {op.get('layout')}, {len(st.partitions)} state partitions{settings}")
    print(f"keys: {st.keys} ({st.keys_with_timeout} with a pending timeout), {st.bytes_on_disk} bytes on disk")
    if st.reads:
        print(_reads_line(st.reads))
    print(f"committed batches: {len(st.committed_batches)}"
          + (f" ({st.committed_batches[0]}..{st.committed_batches[-1]})" if st.committed_batches else ""))
    for p in st.partitions:
        print(f"  partition {p.partition}: {p.keys} keys, {p.bytes_on_disk} bytes")
    for b, n in sorted(st.keys_per_batch.items()):
        print(f"  after batch {b}: {n} keys")
    return 0


def _operator_line(op: dict[str, Any]) -> str:
    """``state stats``' line on the operator: what the checkpoint records of it (PySpark 3.5 records
    no time mode, output mode or state variables).

    >>> print(_operator_line({"operator_id": 0, "operator": "applyInPandasWithState", "time_mode": None,
    ...                       "output_mode": None, "state_variables": []}))
    operator 0: applyInPandasWithState
    """
    parts = [f"operator {op['operator_id']}: {op['operator']}"]
    if op.get("time_mode"):
        parts.append(f"time mode {op['time_mode']}")
    if op.get("output_mode"):
        parts.append(f"output mode {op['output_mode']}")
    if op.get("state_variables"):
        parts.append(f"state variables {', '.join(op['state_variables'])}")
    return ", ".join(parts)


def _reads_line(r: dict[str, Any]) -> str:
    """``state stats``' line on how batches read a batched engine's state.

    >>> print(_reads_line({"buckets": 8, "leaves": 480, "keys_per_leaf": 41.7, "scan_from_keys_per_bucket": 41,
    ...                    "scan_from_keys_per_batch": 328, "buckets_read_by_key_only": 0}))
    reads: 480 leaves in 8 buckets, 41.7 keys per leaf; a bucket is read in one scan when a batch touches about 41 of its keys or more (about 328 keys per batch, spread over the buckets), else leaf by leaf
    """
    line = f"reads: {r['leaves']} leaves in {r['buckets']} buckets, {r['keys_per_leaf']} keys per leaf; "
    if r["scan_from_keys_per_bucket"] is None:
        return line + "every bucket has fewer than 8 leaves and is read leaf by leaf"
    line += (f"a bucket is read in one scan when a batch touches about {r['scan_from_keys_per_bucket']} of its keys or"
             f" more (about {r['scan_from_keys_per_batch']} keys per batch, spread over the buckets), else leaf by leaf")
    if r["buckets_read_by_key_only"]:
        line += f"; {r['buckets_read_by_key_only']} buckets with fewer than 8 leaves are always read leaf by leaf"
    return line


def _export(args: argparse.Namespace) -> int:
    import sparkstate as ss

    n = ss.state.export(_session(args), args.checkpoint, args.path, batch_id=args.batch)
    print(f"exported the state of {n} keys to {args.path}; start a new query from it with --initial-state {args.path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from ..extras import require
    from ..observe.report import write_report

    if not os.path.isfile(args.metrics):
        from ..errors import ConfigError

        raise ConfigError(f"report: metrics file {args.metrics} does not exist; write one with"
                          " `sparkstate run ... --metrics FILE`")
    require("report", "report: plotting")

    r = write_report(args.metrics, args.out)
    print(r.summary, end="")
    for p in r.images:
        print(f"wrote {p}")
    return 0
