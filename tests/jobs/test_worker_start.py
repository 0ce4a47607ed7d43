"""A Python process Spark starts for a query that does not connect back within Spark's fixed 10 s
(a machine too busy to start it in time): ``sparkstate run`` starts the query again on its
checkpoint, exactly; after 3 such failures it stops with one line. The fault is real: Spark's
workers run a Python that exits at start for the process named (tests/refusing_python.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pyarrow.parquet as pq

from tests.refusing_python import RefusingPython

# Spark starts it on the driver while it plans a transformWithState query (every engine uses one).
DRIVER_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"


def _run(python: RefusingPython, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkstate.cli", *args], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYSPARK_PYTHON": str(python.path)})


def test_a_query_stopped_by_a_python_process_that_never_connected_is_started_again(tmp_path):
    (tmp_path / "py").mkdir()
    python = RefusingPython(tmp_path / "py", DRIVER_WORKER)
    words = [f"w{i % 4}" for i in range(30)]
    (tmp_path / "in").mkdir()
    for i in range(0, 30, 10):
        (tmp_path / "in" / f"part-{i:03d}.json").write_text("".join(json.dumps({"word": w}) + "\n" for w in words[i:i + 10]))
    out, ck = tmp_path / "out", tmp_path / "ck"
    args = ["run", "running-count", "--source", f"files:{tmp_path / 'in'}", "--format", "json",
            "--sink", f"parquet:{out}", "--checkpoint", str(ck), "--once", "--no-progress"]

    python.refuse(3)  # three in a row: one line, and no batch committed
    failed = _run(python, *args)
    assert failed.returncode == 1 and python.left() == 0, failed.stderr[-3000:]
    errors = [line for line in failed.stderr.splitlines() if line.startswith("sparkstate: error")]
    assert len(errors) == 1 and "Python worker failed to connect back" in errors[0], failed.stderr[-3000:]
    assert failed.stderr.count("starting it again on its checkpoint") == 2 and "Traceback" not in failed.stderr
    assert not (ck / "commits" / "0").exists()

    python.refuse(1)  # once: the query is started again and its output is exact
    done = _run(python, *args)
    assert done.returncode == 0 and python.left() == 0, done.stderr[-3000:]
    assert "starting it again on its checkpoint (attempt 2 of 3)" in done.stderr
    rows = pq.read_table(out).to_pylist()
    best: dict[str, int] = {}
    for r in rows:
        best[r["word"]] = max(best.get(r["word"], 0), r["count"])
    assert best == dict(Counter(words))
    assert set(Counter((r["batch_id"], r["word"]) for r in rows).values()) == {1}
