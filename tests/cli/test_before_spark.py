"""Mistakes that need no Spark are answered before Spark starts: one line with the fix, no JVM.

Each case runs ``sparkstate`` in a child process whose ``JAVA_HOME`` is a stand-in ``java`` that
only leaves a mark: had pyspark tried to start its JVM, the mark would be there. A missing extra
is a package the child cannot import (``sys.modules[name] = None`` in its ``sitecustomize``, which
is what Python does for an absent package); the same mistakes are tried in a fresh venv
without the extras when a release is checked (README's "Install").
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sparkstate(tmp_path: Path, args: list[str], hide: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, float, Path]:
    java_home = tmp_path / "java"
    (java_home / "bin").mkdir(parents=True, exist_ok=True)
    mark = tmp_path / "jvm-started"
    java = java_home / "bin" / "java"
    java.write_text(f"#!/bin/sh\ntouch '{mark}'\nexit 1\n")
    java.chmod(0o755)
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in hide))
    env = {**os.environ, "JAVA_HOME": str(java_home), "SPARKSTATE_JVM_ARCHIVE": "0",
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("SPARK_REMOTE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "sparkstate", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done, cpu, mark


def _metrics(tmp_path: Path) -> str:
    p = tmp_path / "m.jsonl"
    p.write_text('{"batch_id": 0}\n')
    return str(p)


CASES = {
    "state show, no such checkpoint": (
        ["state", "show", "/nonexistent"], (),
        "checkpoint /nonexistent does not exist; give the checkpoint directory of a query (its --checkpoint or"
        " checkpointLocation)"),
    "state stats, no such checkpoint": (
        ["state", "stats", "/nonexistent"], (),
        "checkpoint /nonexistent does not exist; give the checkpoint directory of a query (its --checkpoint or"
        " checkpointLocation)"),
    "state export, a directory without state": (
        ["state", "export", "{tmp}", "{tmp}/out"], (),
        "checkpoint {tmp} has no committed state yet (no batch has completed); run the query until it commits a"
        " batch, or give another checkpoint"),
    "run, no such source directory": (
        ["run", "running-count", "--source", "files:/nonexistent"], (),
        "run: the source directory /nonexistent does not exist; create it (files:DIR reads the files that land in"
        " DIR)"),
    "run, a file sink without a checkpoint": (
        ["run", "running-count", "--source", "files:{tmp}", "--sink", "parquet:{tmp}/out"], (),
        "run: a parquet sink needs --checkpoint DIR (it is what makes the output exactly-once across restarts)"),
    "run, a memory sink and nowhere for dead letters": (
        ["run", "running-count", "--source", "files:{tmp}", "--format", "json", "--sink", "memory"], (),
        "run: the sink memory has no default place for dead letters (malformed records are never dropped"
        " silently); pass --deadletter SPEC, e.g. --deadletter json:DIR"),
    "run, no such initial state": (
        ["run", "running-count", "--source", "files:{tmp}", "--initial-state", "/nonexistent.parquet"], (),
        "run: the initial state /nonexistent.parquet does not exist (--initial-state takes what `sparkstate state"
        " export` wrote, or JSON lines)"),
    "run, processing time with a watermark": (
        ["run", "sessionize", "--source", "files:{tmp}", "--time-mode", "processing", "--watermark", "5 seconds"], (),
        "run: --watermark applies to --time-mode event; processing time has no watermark (drop --watermark, or use"
        " --time-mode event)"),
    "run, delta: without deltalake": (
        ["run", "running-count", "--source", "files:{tmp}", "--sink", "delta:{tmp}/t", "--checkpoint", "{tmp}/ck"],
        ("deltalake",), "run: the delta: sink needs the deltalake package: pip install 'sparkstate[delta]'"),
    "run, postgres: without psycopg": (
        ["run", "running-count", "--source", "files:{tmp}", "--sink", "postgres:postgresql://u@h/db/t",
         "--checkpoint", "{tmp}/ck"],
        ("psycopg",), "run: the postgres: sink needs psycopg: pip install 'sparkstate[postgres]'"),
    "run --remote without the Connect client": (
        ["run", "running-count", "--source", "files:{tmp}", "--remote", "sc://127.0.0.1:1"], ("grpc",),
        "run: --remote sc://127.0.0.1:1 needs the Spark Connect client (pyspark[connect]: grpcio, grpcio-status,"
        " googleapis-common-protos, zstandard): pip install 'sparkstate[connect]'"),
    "state show --remote without the Connect client": (
        ["state", "show", "/nonexistent", "--remote", "sc://127.0.0.1:1"], ("grpc",),
        "state show: --remote sc://127.0.0.1:1 needs the Spark Connect client (pyspark[connect]: grpcio, grpcio-status,"
        " googleapis-common-protos, zstandard): pip install 'sparkstate[connect]'"),
    "report, no such file (and no matplotlib)": (
        ["report", "/nonexistent.jsonl", "--out", "{tmp}/r"], ("matplotlib",),
        "report: metrics file /nonexistent.jsonl does not exist; write one with `sparkstate run ... --metrics FILE`"),
    "report without matplotlib": (
        ["report", "{metrics}", "--out", "{tmp}/r"], ("matplotlib",),
        "report: plotting needs matplotlib: pip install 'sparkstate[report]'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_answered_before_spark_starts(tmp_path, case):
    args, hide, message = CASES[case]
    fill = {"tmp": str(tmp_path), "metrics": _metrics(tmp_path)}
    done, cpu, mark = _sparkstate(tmp_path, [a.format(**fill) for a in args], hide)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"sparkstate: error: {message.format(**fill)}\n"
    assert done.stdout == ""
    assert not mark.exists(), "a JVM was started"
    assert cpu < 2.0, f"{cpu:.2f} s of CPU"


def test_the_stand_in_java_would_see_a_jvm_start(tmp_path):
    """The check above can fail: a command that starts Spark runs the stand-in java, which leaves its mark."""
    (tmp_path / "in").mkdir()
    done, _, mark = _sparkstate(tmp_path, ["run", "running-count", "--source", f"files:{tmp_path / 'in'}", "--once",
                                           "--no-progress"])
    assert done.returncode != 0
    assert mark.exists()
