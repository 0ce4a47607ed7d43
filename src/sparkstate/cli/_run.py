"""``sparkstate run``: settings -> :class:`~sparkstate.jobs.JobConfig` -> :func:`~sparkstate.jobs.run_pipeline`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping

from ._terminal import cli_logging, send_process_output_to


def add_parser(sub: Any) -> None:
    """The ``run`` subcommand (every setting also from env / config file)."""
    from ..jobs.config import PIPELINE_NAMES, JobConfig
    from ..jobs.pipelines import JOB_PIPELINES

    d = JobConfig("sessionize", source="generator")  # the defaults, for the help texts
    columns = ", ".join(f"{p.name} ({', '.join(p.columns)})" for p in JOB_PIPELINES.values())

    def of(setting: str) -> str:  # which pipelines read a setting, for its help text
        return " and ".join(p.name for p in JOB_PIPELINES.values() if setting in p.settings)

    run = sub.add_parser(
        "run",
        help="run a pipeline from a source to a sink (until Ctrl-C, or --once)",
        description=(
            "Run a pipeline on a stream: read SOURCE, send malformed records to the dead-letter sink, write"
            " the pipeline's output to SINK, checkpoint to CHECKPOINT. Settings come from flags, then"
            " SPARKSTATE_* environment variables (SPARKSTATE_SINK, ...), then --config FILE (YAML or TOML),"
            " then the defaults. Ctrl-C lets the running micro-batch commit, then stops."
        ),
        epilog=(
            f"pipelines and their input columns: {columns}. Example: sparkstate run sessionize --source files:in"
            " --format json --sink parquet:out --checkpoint ck --time-mode event --once"
        ),
    )
    run.add_argument("pipeline", nargs="?", choices=PIPELINE_NAMES, metavar="PIPELINE",
                     help=f"one of {', '.join(PIPELINE_NAMES)} (or `pipeline` in the config file)")
    run.add_argument("--source", metavar="SPEC",
                     help="files:DIR | generator[:rate=..,users=..] | socket:[HOST:]PORT | kafka:BROKERS/TOPIC")
    run.add_argument("--format", choices=("json", "csv", "parquet"), help="record format (default: json, or"
                     " what a files: directory holds)")
    run.add_argument("--sink", metavar="SPEC", help=f"console | memory[:NAME] | parquet:DIR | json:DIR |"
                     f" postgres:URL/TABLE (default: {d.sink})")
    run.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory (needed by file and postgres sinks)")
    run.add_argument("--deadletter", metavar="SPEC", help="sink for malformed records (default: DIR/_deadletter"
                     " beside a file sink; console for console)")
    run.add_argument("--gap", metavar="DURATION", help=f"{of('gap')}: inactivity that ends a session (default: {d.gap})")
    run.add_argument("--time-mode", choices=("event", "processing"), help=f"{of('time_mode')}: (default: {d.time_mode})")
    run.add_argument("--watermark", metavar="DURATION", help=f"{of('watermark')}, event time: allowed lateness"
                     f" (default: {d.watermark})")
    run.add_argument("--max-future-skew", metavar="DURATION", help=f"{of('max_future_skew')}, event time: events more than this"
                     " ahead of the processing time go to the dead letters instead of moving the watermark"
                     " (default: no limit)")
    run.add_argument("--emit-on-last", action=argparse.BooleanOptionalAction, default=None,
                     help=f"{of('emit_on_last')}, event time: write a session ending with an is_last event at once, not when"
                     " the watermark passes it (only correct for input in event-time order; default: off)")
    run.add_argument("--trigger", metavar="DURATION", help=f"micro-batch interval (default: {d.trigger})")
    run.add_argument("--initial-state", metavar="PATH", help="the state a new checkpoint starts from: Parquet (as"
                     " `sparkstate state export` writes it) or JSON lines of the key and state fields"
                     " (visited-pages: user_id, visited_pages; json:PATH / parquet:PATH to say which)")
    run.add_argument("--metrics", metavar="FILE", help="append one JSON line per micro-batch to FILE")
    run.add_argument("--once", action=argparse.BooleanOptionalAction, default=None,
                     help="process what is available (and the timeouts it makes due), then stop")
    run.add_argument("--option", action="append", metavar="KEY=VALUE", dest="options",
                     help="an option for the source's reader, e.g. maxFilesPerTrigger=1 (repeatable)")
    run.add_argument("--max-batch-records", metavar="N", help=f"the most records a micro-batch reads from a"
                     f" generator or Kafka source, so a backlog is worked off in bounded batches (default:"
                     f" {d.max_batch_records:,}; 0: no limit)")
    run.add_argument("--max-batch-files", metavar="N", help=f"the most files a micro-batch reads from a files"
                     f" source (default: {d.max_batch_files}; 0: no limit)")
    run.add_argument("--query-name", metavar="NAME", help="name of the streaming query")
    run.add_argument("--spark-log", metavar="FILE", help="where Spark's own output goes when sparkstate starts"
                     " Spark (default: CHECKPOINT/spark.log, or one in the temp directory)")
    run.add_argument("--master", metavar="URL", help="Spark master when sparkstate starts Spark, e.g."
                     " spark://HOST:7077 (default: local[*]; SPARKSTATE_MASTER)")
    run.add_argument("--remote", metavar="URL", help="run on a Spark Connect server, e.g. sc://HOST:15002"
                     " (default: SPARK_REMOTE; SPARKSTATE_REMOTE)")
    run.add_argument("--engine", metavar="NAME", help="state engine: batched or tws (default: the one that wrote the checkpoint, else batched, the fastest)")
    run.add_argument("--packages", metavar="COORDS", help="Maven coordinates Spark resolves at start"
                     " (spark.jars.packages), e.g. Spark's Kafka connector for kafka: sources and sinks")
    run.add_argument("--jars", metavar="PATHS", help="local jar files for Spark's classpath (spark.jars),"
                     " comma-separated (default for kafka: specs: the jars `make kafka` fetched, if any)")
    run.add_argument("--config", metavar="FILE", help="settings from a .yaml/.yml/.toml file")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                     help="show progress: a live table on a terminal, log lines otherwise (default: on)")
    run.set_defaults(run=_run)


RUN_SETTINGS = ("source", "format", "sink", "checkpoint", "deadletter", "gap", "time_mode", "watermark", "trigger",
                "initial_state", "metrics", "once", "query_name", "spark_log", "master", "remote", "engine", "max_future_skew",
                "emit_on_last", "packages", "jars", "config", "max_batch_records", "max_batch_files")


def _connector_settings(config: Any) -> dict[str, str]:
    """spark.jars / spark.jars.packages for a session this command starts (see :mod:`sparkstate.io.connectors`)."""
    from ..io.connectors import spark_settings

    kafka = "kafka" in (config.source_spec.kind, config.sink_spec.kind,
                        config.deadletter_spec.kind if config.deadletter_spec else None)
    return spark_settings(config.packages, config.jars, kafka=kafka)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _default_spark_log(checkpoint: str | None) -> Path:
    if checkpoint and "://" not in checkpoint and not checkpoint.startswith("file:"):
        return Path(checkpoint) / "spark.log"
    return Path(tempfile.gettempdir()) / f"sparkstate-spark-{os.getpid()}.log"


def job_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Any:
    """The :class:`~sparkstate.jobs.JobConfig` of parsed ``sparkstate run`` arguments (flags > env > file).

    >>> from sparkstate.cli import build_parser
    >>> args = build_parser().parse_args(["run", "running-count", "--source", "files:in", "--once"])
    >>> cfg = job_config(args, env={"SPARKSTATE_SINK": "json:out"})
    >>> cfg.pipeline, cfg.sink, cfg.once
    ('running-count', 'json:out', True)
    """
    from ..jobs import load_config

    flags = {k: getattr(args, k) for k in RUN_SETTINGS}
    if args.options:
        flags["options"] = ",".join(args.options)
    return load_config(args.pipeline, flags, os.environ if env is None else env)


def _run(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession
    from rich.console import Console

    import sparkstate as ss

    from ..jobs import JOB_PIPELINES, run_pipeline
    from ..observe import ProgressDisplay
    from ..spark import is_connect, remote_url

    config = job_config(args)
    # Spark's console sink prints on fd 1: keep it on the terminal, and progress off the live table.
    to_console = "console" in (config.sink_spec.kind, config.deadletter_spec.kind if config.deadletter_spec else None)
    active = SparkSession.getActiveSession()
    own_session = active is None
    remote = remote_url(config.remote) if config.master is None else None
    log_path = None
    if own_session and remote is None:  # Spark is not started yet: its console output goes to a log file
        log_path = Path(config.spark_log) if config.spark_log else _default_spark_log(config.checkpoint)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        send_process_output_to(log_path, append=True, keep_stdout=to_console)
    cli_logging(args.progress)
    console = Console(highlight=False)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) if in_main_thread else None
    spark = None
    try:
        with console.status(f"Starting Spark ({remote or config.master or 'local'}) ..."):
            spark = active if active is not None else ss.spark_session(f"sparkstate-{config.pipeline}",
                                                                       master=config.master, remote=remote,
                                                                       config=_connector_settings(config))
        if not own_session and config.master and not is_connect(spark) \
                and spark.sparkContext.master != config.master:
            logging.getLogger("sparkstate").warning("run: master %s ignored: this process already runs Spark on %s",
                                                    config.master, spark.sparkContext.master)
        if in_main_thread:  # after Spark's start, which installs its own handler (see _demo); SIGTERM alike
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, _raise_interrupt)
        pipeline = JOB_PIPELINES[config.pipeline]
        display = ProgressDisplay(console if args.progress and not to_console else None,
                                  title=f"sparkstate run {config.pipeline}",
                                  output_label=pipeline.output_label)
        with display:
            result = run_pipeline(spark, config, on_batch=display.update)
    finally:
        if own_session and spark is not None:
            spark.stop()
        if previous is not None:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])
    _print_run_summary(console, result, pipeline.output_label, log_path)
    return 0


def _print_run_summary(console: Any, r: Any, output_label: str, log_path: Path | None) -> None:
    from rich.table import Table

    how = {"caught_up": "caught up (--once)", "interrupted": "stopped on request", "stopped": "stopped"}
    table = Table(title=f"sparkstate run {r.pipeline}: {how.get(r.stopped_by, r.stopped_by)}",
                  show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("micro-batches", str(r.batches))
    table.add_row("rows in", str(r.input_rows))
    table.add_row(output_label, "-" if r.output_rows is None else str(r.output_rows))
    if r.timed_out is not None:
        table.add_row("  closed by timeout", str(r.timed_out))
    table.add_row("dead letters", str(r.dead_letters))
    if getattr(r, "late_events", None):
        table.add_row("  late events", str(r.late_events))
    table.add_row("keys left in state", "-" if r.keys_in_state is None else str(r.keys_in_state))
    if r.final_watermark:
        table.add_row("final watermark", r.final_watermark)
    table.add_row("duration", f"{r.seconds:.1f} s")
    console.print(table)
    console.print(f"Output: {r.sink}")
    if r.deadletter:
        console.print(f"Dead letters: {r.deadletter}")
    if r.checkpoint:
        console.print(f"Checkpoint: {r.checkpoint}")
    if r.metrics:
        console.print(f"Metrics: {r.metrics}")
    if log_path is not None:
        console.print(f"Spark's log: {log_path.resolve()}")
