"""``sparkstate demo``: the demo job (:func:`sparkstate.demo.run_demo`) and its summary table."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ._terminal import positive_int, send_process_output_to


def add_parser(sub: Any) -> None:
    """The ``demo`` subcommand."""
    demo = sub.add_parser(
        "demo",
        help="sessionize a generated clickstream on local Spark and write the sessions as Parquet",
        description=(
            "Generate a synthetic clickstream into OUT/input, sessionize it in event time with a file"
            " stream (one file per micro-batch), write the sessions to OUT/sessions (Parquet), check them"
            " against the generator's ground truth and print a summary. Ends by itself once the input is"
            " processed; sessions not final at the final watermark (it has not passed their end + gap, or"
            " the end of one closed by a last event) are reported as open."
        ),
    )
    demo.add_argument("--events", type=positive_int, default=3000, help="number of events (default: %(default)s)")
    demo.add_argument("--users", type=positive_int, default=60, help="number of users (default: %(default)s)")
    demo.add_argument("--out", default="sparkstate-demo", help="output directory (default: ./%(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="generator seed (default: %(default)s)")
    demo.add_argument("--kafka", action="store_true", help="read the events through a local Kafka broker (started"
                      " and stopped here, from the jars `python -m sparkstate.io.connectors fetch` (make kafka) fetched) instead of the files")
    demo.add_argument("--remote", metavar="URL", default=os.environ.get("SPARKSTATE_REMOTE"),
                      help="run on a Spark Connect server, e.g. sc://HOST:15002, that shares this machine's files"
                           " (default: SPARKSTATE_REMOTE, else SPARK_REMOTE, else Spark started here)")
    demo.set_defaults(run=_demo)


def _demo(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession
    from rich.console import Console

    import sparkstate as ss

    from ..demo import prepare_out_dir, run_demo
    from ..spark import remote_url

    started = time.monotonic()
    broker = None
    spark_config: dict[str, str] = {}
    if getattr(args, "kafka", False):
        from ..errors import ConfigError
        from ..io import connectors

        missing = [g for g in ("spark-kafka", "kafka-broker") if not connectors.fetched(g)]
        if missing:
            raise ConfigError(f"demo --kafka: the Kafka jars ({', '.join(missing)}) are not fetched:"
                              f" {connectors.MAKE_HINT}")
        try:
            import confluent_kafka  # noqa: F401  (producing the events to the topic)
        except ImportError:
            raise ConfigError("demo --kafka: producing to the broker needs confluent-kafka:"
                              " pip install 'sparkstate[kafka]'") from None
        spark_config = connectors.spark_settings(kafka=True)
    out = prepare_out_dir(Path(args.out).absolute())  # a Spark Connect server has a working directory of its own
    log_path = out / "spark.log"
    active = SparkSession.getActiveSession()  # embedded (e.g. a notebook): use it as it is
    own_session = active is None
    remote = remote_url(getattr(args, "remote", None))
    if remote is not None:
        from ..extras import require

        require("connect", f"demo: --remote {remote}")
    if own_session and remote is None:  # Spark is not started yet: its console output goes to the log file
        send_process_output_to(log_path)
    console = Console(highlight=False)
    spark = None
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.getsignal(signal.SIGINT) if in_main_thread else None
    try:
        with console.status("Starting Spark (local) ...") as status:
            if spark_config:
                from ..io import kafka_broker

                status.update("Starting a local Kafka broker ...")
                broker = kafka_broker.start()
                status.update("Starting Spark (local) ...")
            spark = active if active is not None else ss.spark_session("sparkstate-demo", config=spark_config,
                                                                       remote=remote)
            if in_main_thread:
                # PySpark's own SIGINT handler calls into the JVM from inside the interrupted
                # call (a py4j re-entrancy error); a plain KeyboardInterrupt lets run_demo let
                # the running micro-batch commit, then stop the query.
                signal.signal(signal.SIGINT, signal.default_int_handler)
            status.update(f"Generating {args.events} events and starting the query ...")

            def on_batch(b: Any) -> None:
                status.update(
                    f"Micro-batch {b.batch_id}: {b.input_rows} events in, watermark {b.watermark},"
                    f" {b.state_rows} rows in the state store"
                )

            result = run_demo(spark, out, events=args.events, users=args.users, seed=args.seed, on_batch=on_batch,
                              kafka=broker)
    finally:
        if broker is not None:
            broker.stop()
        if own_session and spark is not None:
            spark.stop()
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    _print_summary(console, result, summary_path, log_path if own_session and remote is None else None,
                   time.monotonic() - started)
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
    table.add_row("still open at the end", str(r.open_sessions), "kept in state: not final at that watermark")
    table.add_row("final watermark", "", str(r.final_watermark))
    verdict = "yes" if r.matches_reference else "NO"
    table.add_row("equals the reference", verdict, f"{r.reference_sessions} sessions finished by that watermark")
    table.add_row("duration", f"{r.seconds:.1f} s", f"{total_s:.1f} s with Spark's start")
    console.print(table)
    console.print(f"Sessions (Parquet): {r.sessions_dir}", soft_wrap=True, markup=False)
    console.print(f"Summary: {summary_path.resolve()}", soft_wrap=True, markup=False)
    if log_path is not None:
        console.print(f"Spark's log: {log_path.resolve()}", soft_wrap=True, markup=False)
    console.print(f"Read them with: spark.read.parquet({r.sessions_dir!r})", soft_wrap=True, markup=False)
    if not r.matches_reference:
        console.print("[bold red]The written sessions differ from the reference:[/]")
        for line in r.mismatches:
            console.print(f"  {line}")
