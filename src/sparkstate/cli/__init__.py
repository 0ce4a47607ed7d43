"""The ``sparkstate`` command line. Thin: it parses, calls library functions, and prints.

One module per command: ``_demo`` (:func:`sparkstate.demo.run_demo`), ``_run``
(:func:`sparkstate.jobs.run_pipeline`), ``_generate`` (:mod:`sparkstate.jobs.generate`);
``_terminal`` keeps Spark's own output in a log file. The only package that prints.

>>> build_parser().parse_args(["demo", "--events", "500"]).events
500
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from typing import Sequence

from .. import __version__
from ..errors import JobFailedError, SparkStateError, from_spark
from . import _demo, _generate, _jvm_archive, _run, _state
from ._run import job_config

__all__ = ["build_parser", "job_config", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sparkstate`` (one subcommand per job)."""
    parser = argparse.ArgumentParser(
        prog="sparkstate",
        description="Stateful stream processing for PySpark: keyed state, timeouts and sessionization.",
    )
    parser.add_argument("--version", action="version", version=f"sparkstate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _demo.add_parser(sub)
    _run.add_parser(sub)
    _generate.add_parser(sub)
    _state.add_parser(sub)
    _jvm_archive.add_parser(sub)
    return parser


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
    # A Spark Connect session stopped at the end of a run is collected at exit, and PySpark's
    # cleanup then tries to remove its listeners on the server it has already left.
    warnings.filterwarnings("ignore", message="Failed to remove the listener", category=UserWarning)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("\nsparkstate: interrupted; the query was stopped.", file=sys.stderr)
        return 130
    except JobFailedError as exc:
        print(f"sparkstate: error: {exc}", file=sys.stderr)
        return 1
    except SparkStateError as exc:
        print(f"sparkstate: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not from_spark(exc):
            raise
        # Spark refused something (a definition, a path); its first line says why.
        lines = str(exc).strip().splitlines()
        print(f"sparkstate: error from Spark: {lines[0] if lines else type(exc).__name__}", file=sys.stderr)
        return 1

