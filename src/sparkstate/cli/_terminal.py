"""Terminal plumbing shared by the commands: Spark's own output into a log file, our log lines to stderr."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def send_process_output_to(log_path: Path, append: bool = False, keep_stdout: bool = False) -> None:
    """Point file descriptors 1 and 2 at ``log_path`` (the JVM and the Python workers Spark starts
    inherit them), and keep ``sys.stdout``/``sys.stderr`` on the terminal. ``keep_stdout`` leaves
    fd 1 alone (Spark's console sink prints there)."""
    sys.stdout.flush()
    sys.stderr.flush()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if fd == 1 and keep_stdout:
            continue
        term = os.dup(fd)
        os.dup2(log_fd, fd)
        stream = getattr(sys, name)
        setattr(sys, name, os.fdopen(term, "w", buffering=1, encoding=stream.encoding or "utf-8"))
    os.close(log_fd)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (the terminal, after fd 2 went to Spark's log)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def cli_logging(progress: bool) -> None:
    """sparkstate's warnings, and (with ``progress``) the progress lines, go to stderr with a time stamp."""
    logger = logging.getLogger("sparkstate")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logging.getLogger("sparkstate.progress").setLevel(logging.INFO if progress else logging.WARNING)
