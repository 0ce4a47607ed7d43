"""The job that records the driver JVM's class-data archive (:mod:`sparkstate.jvm_archive` is
where it lives and how a driver maps it): ``sparkstate jvm-archive`` / ``make`` call :func:`build`.

:func:`build` starts a child process (``python -m sparkstate.jobs.archive_job TARGET``) whose JVM
records every class it loads while a small sessionize job runs (:func:`record`), and writes the
archive as it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import SparkStateError
from ..jvm_archive import ENV, RECORD_OPTION, archive_path, remove_stale
from ..spark import spark_session
from ..synthetic import StreamConfig
from .config import JobConfig
from .generate import generate_files
from .run import run_pipeline


def build(timeout_s: float = 900.0) -> tuple[Path, float]:
    """Make the archive for this Java and pyspark (replacing one that is there); its path and size in MB.

    A child process starts a local session with the recording option, runs a small sessionize
    job into Parquet with a checkpoint (so the classes of the state store, the file source and
    sink and the Python runners are loaded too) and stops; its JVM writes the archive as it exits,
    under a temporary name that is renamed into place once the JVM is gone.
    """
    path = archive_path()
    if path is None:
        raise SparkStateError("jvm-archive: no java found (set JAVA_HOME, or put java on PATH)")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    env = {**os.environ, ENV: "off"}
    try:
        done = subprocess.run([sys.executable, "-m", "sparkstate.jobs.archive_job", str(partial)], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SparkStateError(f"jvm-archive: the recording JVM wrote no archive ({tail[0]})")
        os.replace(partial, path)
        remove_stale(path)
    except subprocess.TimeoutExpired:
        raise SparkStateError(f"jvm-archive: the recording run took over {timeout_s:.0f} s") from None
    finally:
        partial.unlink(missing_ok=True)
    return path, path.stat().st_size / 1e6


def record(target: str) -> None:
    """The child of :func:`build`: a session that records ``target`` at exit, a small job, then exit."""
    from pyspark import SparkContext

    spark = spark_session("sparkstate-jvm-archive", config={
        "spark.driver.extraJavaOptions": f"{RECORD_OPTION}{target}"})
    with tempfile.TemporaryDirectory(prefix="sparkstate-jvm-archive-") as d:
        root = Path(d)
        generate_files(root / "in", StreamConfig(users=10, seed=1, events=300, rate=0, malformed_share=0.02), files=2)
        run_pipeline(spark, JobConfig("sessionize", source=f"files:{root / 'in'}", format="json",
                                      sink=f"parquet:{root / 'out'}", checkpoint=str(root / "ck"), gap="1 minute",
                                      time_mode="event", watermark="0 seconds", once=True))
        spark.read.parquet(str(root / "out")).count()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if gateway is not None and proc is not None:  # the JVM writes the archive when it exits: wait for it
        gateway.shutdown()
        proc.stdin.close()
        proc.wait(timeout=600)


if __name__ == "__main__":
    record(sys.argv[1])
