"""``sparkstate jvm-archive``: make the driver JVM's class-data archive (:mod:`sparkstate.jobs.archive_job`)."""

from __future__ import annotations

import argparse
import time
from typing import Any


def add_parser(sub: Any) -> None:
    """The ``jvm-archive`` subcommand."""
    cmd = sub.add_parser(
        "jvm-archive",
        help="make the class-data archive that starts local Spark drivers faster",
        description=(
            "Runs a small sessionize job in a JVM that records the classes it loads, and keeps them in"
            " an archive for this Java and this pyspark (under $SPARKSTATE_CACHE/jvm, else"
            " ~/.cache/sparkstate/jvm); it takes about 1.5 minutes. Every local session sparkstate starts"
            " afterwards maps it: on a quiet two-core machine `ss.spark_session()` took 6.6 s instead of"
            " 9.5 s (docs/install.md). Run it once after installing sparkstate (in a checkout, `make"
            " test` runs it), and again after changing Java or pyspark. A damaged or foreign archive is"
            " skipped; SPARKSTATE_JVM_ARCHIVE=off turns it off."
        ),
    )
    cmd.add_argument("--path", action="store_true", help="print where the archive is (or would be), make nothing")
    cmd.set_defaults(run=_jvm_archive)


def _jvm_archive(args: argparse.Namespace) -> int:
    from ..jobs.archive_job import build
    from ..jvm_archive import archive_path

    if args.path:
        print(archive_path() or "no java found")
        return 0
    started = time.monotonic()
    path, mb = build()
    print(f"Wrote the driver JVM's class-data archive ({mb:.0f} MB) in {time.monotonic() - started:.0f} s: {path}")
    return 0
