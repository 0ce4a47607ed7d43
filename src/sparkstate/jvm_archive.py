"""A class-data archive for the driver JVM: a local session starts in about 60% of the time.

A local Spark driver loads some 20,000 classes from pyspark's jars before its first job; the JVM
reads, verifies and links each one, and that is most of the 11 s a session takes to start on two
cores (and again most of its first job). Java 17's class-data sharing keeps those classes in an
archive, already parsed and verified, and maps it at start-up. The archive is made once, by a
JVM that runs a small sessionize job (:func:`sparkstate.jobs.archive_job.build`: ``sparkstate
jvm-archive``, which ``make test`` runs first), and :func:`~sparkstate.spark_session` passes it to every
local driver it starts afterwards (``-XX:SharedArchiveFile``, through ``SPARK_SUBMIT_OPTS``).
This module is that run-time half: where the archive is and the start-up option.

An archive fits one JVM build and one classpath (pyspark's jars, each of its size and time), so
its file name is a hash of both (:func:`archive_path`): another Java, another pyspark or the same
one installed again looks for another file. A JVM that
still finds its archive unusable (changed jars, a damaged file) starts without it, as it would
with none; nothing fails. The archive lives in ``$SPARKSTATE_CACHE/jvm`` (else
``~/.cache/sparkstate/jvm``); ``SPARKSTATE_JVM_ARCHIVE=off`` starts every JVM without it.
Only a driver this process starts uses it: executors of a cluster, a Spark Connect server and
a session that already runs are left as they are.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .paths import cache_dir

log = logging.getLogger("sparkstate")

#: Turns the archive off (``SPARKSTATE_JVM_ARCHIVE=off``).
ENV = "SPARKSTATE_JVM_ARCHIVE"
#: The JVM option naming the archive to map at start-up.
USE_OPTION = "-XX:SharedArchiveFile="
#: What Spark's launcher adds to the command line of the JVM that runs a client-mode driver.
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
#: The JVM option that writes one at exit, with every class the JVM loaded (Java 13+).
RECORD_OPTION = "-XX:ArchiveClassesAtExit="
#: Options that already name an archive (to map, or to record): the launch is left alone.
ARCHIVE_OPTIONS = ("SharedArchiveFile", "ArchiveClassesAtExit")


def _java() -> Path | None:
    """The ``java`` pyspark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else (Path(p) if (p := shutil.which("java")) else None)
    return found.resolve() if found is not None and found.exists() else None


def archive_path() -> Path | None:
    """Where the archive for this Java and this pyspark is (or would be); ``None`` without a Java."""
    import pyspark

    java = _java()
    if java is None:
        return None
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    stat = java.stat()
    where = "\n".join([str(java), str(stat.st_size), str(int(stat.st_mtime)), pyspark.__version__, str(jars)])
    # The JVM refuses an archive when any jar's size or time differs from when it was made (pip
    # installing pyspark again at the same path, say), so they name the file too.
    found = sorted(jars.glob("*.jar")) if jars.is_dir() else []
    files = "\n".join(f"{p.name} {s.st_size} {int(s.st_mtime)}" for p in found for s in [p.stat()])
    return cache_dir() / "jvm" / f"driver-{pyspark.__version__}-{_digest(where)}-{_digest(files)}.jsa"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def driver_option() -> str | None:
    """``-XX:SharedArchiveFile=PATH`` when this Java and pyspark have an archive and it is not turned off."""
    if os.environ.get(ENV, "").lower() in ("off", "0", "false", "no"):
        return None
    path = archive_path()
    return f"{USE_OPTION}{path}" if path is not None and path.is_file() and path.stat().st_size > 0 else None


@contextmanager
def launching_with_archive(java_options: str | None = None) -> Iterator[None]:
    """Within it, a driver JVM launched by pyspark maps the archive (when there is one).

    The option goes in ``SPARK_SUBMIT_OPTS``, which Spark's launcher adds to the driver's command
    line beside ``spark.driver.extraJavaOptions`` from any source (so ``spark-defaults.conf``
    keeps its say), and only for the launch: the variable is as it was afterwards. Options that
    already name an archive or record one (``java_options``, or the variable) are left alone.
    """
    before = os.environ.get(SUBMIT_OPTS)
    mine = " ".join(filter(None, [java_options, before]))
    option = None if any(o in mine for o in ARCHIVE_OPTIONS) else driver_option()
    if option is None:
        yield
        return
    os.environ[SUBMIT_OPTS] = f"{before} {option}" if before else option
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SUBMIT_OPTS, None)
        else:
            os.environ[SUBMIT_OPTS] = before


def remove_stale(path: Path) -> list[Path]:
    """Delete the archives made for the same Java and pyspark path before its jars changed (which
    can never map again) beside ``path``; the ones deleted."""
    gone = [p for p in path.parent.glob(path.name.rsplit("-", 1)[0] + "-*.jsa") if p != path]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone
