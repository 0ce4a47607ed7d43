"""``sparkstate run``: settings -> :class:`~sparkstate.jobs.JobConfig` -> :func:`~sparkstate.jobs.run_pipeline`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping

from rich.console import Console

from ._terminal import cli_logging, send_process_output_to


def add_parser(sub: Any) -> None:
    """The ``run`` subcommand: one flag per declared setting (:mod:`sparkstate.jobs.settings`)."""
    from ..jobs.config import PIPELINE_NAMES
    from ..jobs.pipelines import JOB_PIPELINES
    from ..jobs.settings import JOB_SETTINGS

    columns = ", ".join(f"{p.name} ({', '.join(p.columns)})" for p in JOB_PIPELINES.values())
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
    for setting in JOB_SETTINGS:
        _add_flag(run, setting)
    seen = {s.name for s in JOB_SETTINGS}
    for pipeline in JOB_PIPELINES.values():
        own = [s for s in pipeline.settings if s.name not in seen]
        if own:
            group = run.add_argument_group(f"settings of {pipeline.name} (other pipelines ignore them)")
            for setting in own:
                _add_flag(group, setting, pipeline.name)
            seen.update(s.name for s in own)
    run.add_argument("--config", metavar="FILE", help="settings from a .yaml/.yml/.toml file (keys: the flags'"
                     " names; also SPARKSTATE_CONFIG)")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                     help="show progress: a live table on a terminal, log lines otherwise (default: on)")
    run.set_defaults(run=_run)


def _add_flag(parser: Any, setting: Any, owner: str = "") -> None:
    """The flag of one declared setting: its kind decides the argparse action."""
    help_text = setting.help_text(owner) + f" [{setting.env}]"
    if setting.kind == "bool":
        parser.add_argument(setting.flag, dest=setting.name, action=argparse.BooleanOptionalAction, default=None,
                            help=help_text)
    elif setting.kind == "options":
        parser.add_argument(setting.flag, dest=setting.name, action="append", metavar=setting.metavar,
                            help=help_text)
    elif setting.kind == "choice":
        parser.add_argument(setting.flag, dest=setting.name, choices=setting.choices, help=help_text)
    else:
        parser.add_argument(setting.flag, dest=setting.name, metavar=setting.metavar, help=help_text)


def _connector_settings(config: Any) -> dict[str, str]:
    """spark.jars / spark.jars.packages for a session this command starts (see :mod:`sparkstate.io.connectors`)."""
    from ..io.connectors import spark_settings

    kafka = "kafka" in (config.source_spec.kind, config.sink_spec.kind,
                        config.deadletter_spec.kind if config.deadletter_spec else None)
    return spark_settings(config.packages, config.jars, kafka=kafka, delta=config.sink_spec.kind == "delta")


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
    >>> cfg = job_config(args, env={"SPARKSTATE_SINK": "json:out", "SPARKSTATE_CHECKPOINT": "ck"})
    >>> cfg.pipeline, cfg.sink_spec.kind, cfg.once
    ('running-count', 'json', True)
    """
    from ..jobs.config import all_settings, load_config

    flags = {name: getattr(args, name) for name in all_settings()}
    flags["config"] = args.config
    return load_config(args.pipeline, flags, os.environ if env is None else env)


def _run(args: argparse.Namespace) -> int:
    from ..jobs.config import check_here
    from ..spark import remote_url

    config = job_config(args)
    remote = remote_url(config.remote) if config.master is None else None
    check_here(config, remote)  # what needs no Spark is refused before Spark starts
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    own_session = active is None
    log_path, scratch_log = None, False
    if own_session and remote is None:  # Spark is not started yet: its console output goes to a log file
        log_path = Path(config.spark_log) if config.spark_log else _default_spark_log(config.checkpoint)
        scratch_log = not config.spark_log and log_path.parent == Path(tempfile.gettempdir())
        log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        result, label = _run_job(args, config, active, remote, log_path)
    except BaseException:
        if scratch_log and log_path is not None and log_path.exists():
            sys.stderr.write(f"sparkstate: Spark's log: {log_path}\n")
        raise
    if scratch_log and log_path is not None:
        log_path.unlink(missing_ok=True)  # the run went well: nothing left in the temp directory
        log_path = None
    _print_run_summary(Console(highlight=False), result, label, log_path)
    return 0


def _run_job(args: argparse.Namespace, config: Any, active: Any, remote: str | None,
             log_path: Path | None) -> tuple[Any, str]:
    import sparkstate as ss

    from ..jobs import JOB_PIPELINES, run_pipeline
    from ..observe import ProgressDisplay
    from ..spark import is_connect

    # Spark's console sink prints on fd 1: keep it on the terminal, and progress off the live table.
    to_console = "console" in (config.sink_spec.kind, config.deadletter_spec.kind if config.deadletter_spec else None)
    own_session = active is None
    if log_path is not None:
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
    return result, pipeline.output_label


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
