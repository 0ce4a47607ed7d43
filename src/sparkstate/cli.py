"""The ``sparkstate`` command line. Thin: it parses, calls library functions, and prints.

>>> build_parser().parse_args(["demo", "--events", "500"]).events
500
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from .errors import SparkStateError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sparkstate`` (one subcommand per job)."""
    parser = argparse.ArgumentParser(
        prog="sparkstate",
        description="Stateful stream processing for PySpark: keyed state, timeouts and sessionization.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = sub.add_parser(
        "demo",
        help="sessionize a generated clickstream on local Spark and write the sessions as Parquet",
        description=(
            "Generate a synthetic clickstream into OUT/input, sessionize it in event time with a file"
            " stream (one file per micro-batch), write the sessions to OUT/sessions (Parquet), check them"
            " against the generator's ground truth and print a summary. Ends by itself once the input is"
            " processed; sessions whose gap has not yet passed the final watermark are reported as open."
        ),
    )
    demo.add_argument("--events", type=_positive_int, default=3000, help="number of events (default: %(default)s)")
    demo.add_argument("--users", type=_positive_int, default=60, help="number of users (default: %(default)s)")
    demo.add_argument("--out", default="sparkstate-demo", help="output directory (default: ./%(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="generator seed (default: %(default)s)")
    demo.set_defaults(run=_demo)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _send_process_output_to(log_path: Path) -> None:
    """Point file descriptors 1 and 2 at ``log_path`` (the JVM and the Python workers Spark starts
    inherit them), and keep ``sys.stdout``/``sys.stderr`` on the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    term_out, term_err = os.dup(1), os.dup(2)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stdout = os.fdopen(term_out, "w", buffering=1, encoding=sys.stdout.encoding or "utf-8")
    sys.stderr = os.fdopen(term_err, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8")


def _demo(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession
    from rich.console import Console

    import sparkstate as ss

    from .demo import prepare_out_dir, run_demo

    started = time.monotonic()
    out = prepare_out_dir(args.out)
    log_path = out / "spark.log"
    active = SparkSession.getActiveSession()  # embedded (e.g. a notebook): use it as it is
    own_session = active is None
    if own_session:  # Spark is not started yet: its console output goes to the log file
        _send_process_output_to(log_path)
    console = Console(highlight=False)
    spark = None
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.getsignal(signal.SIGINT) if in_main_thread else None
    try:
        with console.status("Starting Spark (local) ...") as status:
            spark = active if active is not None else ss.spark_session("sparkstate-demo")
            if in_main_thread:
                # PySpark's own SIGINT handler calls into the JVM from inside the interrupted
                # call (a py4j re-entrancy error); a plain KeyboardInterrupt lets run_demo let
                # the running micro-batch commit, then stop the query.
                signal.signal(signal.SIGINT, signal.default_int_handler)
            status.update(f"Generating {args.events} events and starting the query ...")

            def on_batch(b: Any) -> None:
                status.update(
                    f"Micro-batch {b.batch_id}: {b.input_rows} events in, watermark {b.watermark},"
                    f" {b.keys_in_state} open sessions in state"
                )

            result = run_demo(spark, out, events=args.events, users=args.users, seed=args.seed, on_batch=on_batch)
    finally:
        if own_session and spark is not None:
            spark.stop()
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    _print_summary(console, result, summary_path, log_path if own_session else None, time.monotonic() - started)
    return 0 if result.matches_reference else 1


def _print_summary(console: Any, r: Any, summary_path: Path, log_path: Path | None, total_s: float) -> None:
    from rich.table import Table

    table = Table(title="sparkstate demo: event-time sessionization", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_column("note", style="dim")
    table.add_row("input events", str(r.input_events), f"{r.input_users} users, {r.input_files} files")
    table.add_row("micro-batches", str(r.batches), "one file each, then a watermark-only batch")
    table.add_row("sessions written", str(r.sessions_written), f"gap {r.gap}, watermark delay {r.watermark_delay}")
    for how, n in r.closed_by.items():
        table.add_row(f"  closed by {how}", str(n), "")
    table.add_row("users with sessions", str(r.users_with_sessions), "")
    table.add_row("events in sessions", str(r.events_in_sessions), "")
    table.add_row("still open at the end", str(r.open_sessions), "kept in state: end + gap >= watermark")
    table.add_row("final watermark", "", str(r.final_watermark))
    verdict = "yes" if r.matches_reference else "NO"
    table.add_row("equals the reference", verdict, f"{r.reference_sessions} sessions finished by that watermark")
    table.add_row("duration", f"{r.seconds:.1f} s", f"{total_s:.1f} s with Spark's start")
    console.print(table)
    console.print(f"Sessions (Parquet): {r.sessions_dir}")
    console.print(f"Summary: {summary_path.resolve()}")
    if log_path is not None:
        console.print(f"Spark's log: {log_path.resolve()}")
    console.print(f"Read them with: spark.read.parquet({r.sessions_dir!r})")
    if not r.matches_reference:
        console.print("[bold red]The written sessions differ from the reference:[/]")
        for line in r.mismatches:
            console.print(f"  {line}")


def _not_from_py4j(record: logging.LogRecord) -> bool:
    return f"{os.sep}py4j{os.sep}" not in record.pathname


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sparkstate``; returns the exit code.

    >>> main(["--help"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    SystemExit: 0
    """
    args = build_parser().parse_args(argv)
    # py4j logs an interrupted call (Ctrl-C) with a stack trace on the root logger; the
    # interruption is handled here, so those records are dropped.
    logging.getLogger().addFilter(_not_from_py4j)
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("\nsparkstate: interrupted; the query was stopped.", file=sys.stderr)
        return 130
    except SparkStateError as exc:
        print(f"sparkstate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
