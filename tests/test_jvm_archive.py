"""The driver JVM's class-data archive (sparkstate.jvm_archive): made by ``sparkstate
jvm-archive``, mapped by the JVM of every local session sparkstate starts, and harmless when
it is damaged or turned off. Each session runs in a child process (this one already has its JVM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkstate import jvm_archive
from sparkstate.jobs import archive_job

# A child that starts a session the way users do, runs a job, and reports whether its JVM mapped the archive.
CHILD = """
import json, os, sys
import sparkstate as ss
from pyspark import SparkContext
spark = ss.spark_session()
assert spark.range(5).selectExpr("sum(id)").first()[0] == 10
jvm = SparkContext._gateway.proc.pid  # spark-submit execs the driver's java in this process
maps = open(f"/proc/{jvm}/maps").read()
print(json.dumps({"mapped": sys.argv[1] in maps, "submit_opts": os.environ.get("SPARK_SUBMIT_OPTS")}))
"""


def _session_in_a_child(archive: Path, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(archive)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def archive() -> Path:
    """The archive for this Java and pyspark (``make test`` makes it first; made here when it is missing)."""
    path = jvm_archive.archive_path()
    assert path is not None, "no java found"
    if not path.is_file():
        made, mb = archive_job.build()
        assert made == path and mb > 10
    return path


def _why_not_mapped(archive: Path, tmp_path: Path) -> str:
    """The JVM's own reason for starting without the archive (its CDS log), for the failure message."""
    log = tmp_path / "cds.log"
    opts = " ".join(filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), f"-Xlog:cds=info:file={log}"]))
    _session_in_a_child(archive, SPARK_SUBMIT_OPTS=opts)
    lines = log.read_text().splitlines() if log.is_file() else ["no CDS log written"]
    return "\n".join(ln for ln in lines if "UseSharedSpaces" in ln or "rror" in ln) or "\n".join(lines[-5:])


def test_a_local_session_maps_the_archive_and_leaves_the_environment_as_it_was(archive, tmp_path):
    seen = _session_in_a_child(archive)
    assert seen["mapped"], _why_not_mapped(archive, tmp_path)
    assert seen == {"mapped": True, "submit_opts": os.environ.get("SPARK_SUBMIT_OPTS")}  # the suite's own (conftest)
    # The user's own launcher options stay, the archive beside them.
    assert _session_in_a_child(archive, SPARK_SUBMIT_OPTS="-Dsparkstate.test=1") == {
        "mapped": True, "submit_opts": "-Dsparkstate.test=1"}


def test_turned_off_or_damaged_the_session_starts_without_it(archive, tmp_path):
    assert _session_in_a_child(archive, SPARKSTATE_JVM_ARCHIVE="off")["mapped"] is False
    # An archive another JVM build or classpath made (here: bytes that are no archive) is skipped by the JVM.
    cache = tmp_path / "cache"
    (cache / "jvm").mkdir(parents=True)
    damaged = cache / "jvm" / archive.name
    damaged.write_bytes(os.urandom(1 << 20))
    assert _session_in_a_child(damaged, SPARKSTATE_CACHE=str(cache))["mapped"] is False


def test_the_option_goes_in_only_for_the_launch(archive, monkeypatch):
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    with jvm_archive.launching_with_archive():
        assert os.environ["SPARK_SUBMIT_OPTS"] == f"-XX:SharedArchiveFile={archive}"
    assert "SPARK_SUBMIT_OPTS" not in os.environ
    # A caller that records or names an archive itself keeps its own.
    with jvm_archive.launching_with_archive("-XX:ArchiveClassesAtExit=/tmp/x.jsa"):
        assert "SPARK_SUBMIT_OPTS" not in os.environ
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:SharedArchiveFile=/elsewhere.jsa")
    with jvm_archive.launching_with_archive():
        assert os.environ["SPARK_SUBMIT_OPTS"] == "-XX:SharedArchiveFile=/elsewhere.jsa"


def test_the_archive_is_per_java_and_pyspark(monkeypatch, tmp_path):
    here = jvm_archive.archive_path()
    fake_java = tmp_path / "jdk" / "bin" / "java"
    fake_java.parent.mkdir(parents=True)
    fake_java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    other = jvm_archive.archive_path()
    assert other is not None and other != here and other.parent == here.parent
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "none"))
    assert jvm_archive.archive_path() is None


def test_pyspark_installed_again_looks_for_a_new_archive_and_the_old_one_goes(monkeypatch, tmp_path):
    # pip installing pyspark again at the same path gives its jars new times, and the JVM then
    # refuses an archive made before (as CI saw: "A jar file is not the one used while building").
    import pyspark

    fake = tmp_path / "site" / "pyspark"
    (fake / "jars").mkdir(parents=True)
    jar = fake / "jars" / "spark-core.jar"
    jar.write_bytes(b"jar")
    monkeypatch.setattr(pyspark, "__file__", str(fake / "__init__.py"))
    monkeypatch.setenv("SPARKSTATE_CACHE", str(tmp_path / "cache"))
    first = jvm_archive.archive_path()
    assert jvm_archive.archive_path() == first  # the same jars: the same archive
    os.utime(jar, (1_000_000_000, 1_000_000_000))
    second = jvm_archive.archive_path()
    assert second != first and second.parent == first.parent
    # Made again for the new jars, the archive of the old ones is deleted; other pysparks' stay.
    other = first.with_name("driver-0.0.0-0123456789abcdef-0123456789abcdef.jsa")
    for p in (first, second, other):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    assert jvm_archive.remove_stale(second) == [first]
    assert sorted(p.name for p in second.parent.iterdir()) == sorted([second.name, other.name])
