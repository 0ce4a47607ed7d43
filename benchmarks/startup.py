"""Start-up with and without the driver JVM's class-data archive (sparkstate.jvm_archive).

Two measurements, each in fresh processes, alternating the two settings so that load drifts
hit both alike:

- ``session``: a child process makes ``ss.spark_session()`` and runs one small job; the
  seconds to the session, and to the job's end.
- ``job``: ``sparkstate run sessionize --once`` on 8 small files, one per micro-batch, into
  Parquet with a checkpoint (the unit of a restart in the driver-kill tests): seconds to the first
  batch's commit and to the end of the run.

The archive must exist (``sparkstate jvm-archive``). Prints the medians side by side; the JSON
(every run) goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SESSION_CHILD = """
import json, time
t0 = time.monotonic()
import sparkstate as ss
spark = ss.spark_session()
t1 = time.monotonic()
spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
print(json.dumps({"session_s": t1 - t0, "first_job_s": time.monotonic() - t0}))
"""


def _session(archive: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SESSION_CHILD], capture_output=True, text=True, check=True,
                          env={**os.environ, "SPARKSTATE_JVM_ARCHIVE": archive})
    return json.loads(done.stdout.strip().splitlines()[-1])


def _job(archive: str, work: Path) -> dict:
    ck, out = work / f"ck-{archive}", work / f"out-{archive}"
    for d in (ck, out):
        shutil.rmtree(d, ignore_errors=True)
    cmd = [sys.executable, "-m", "sparkstate.cli", "run", "sessionize", "--source", f"files:{work / 'in'}",
           "--format", "json", "--sink", f"parquet:{out}", "--checkpoint", str(ck), "--gap", "1 minute",
           "--time-mode", "event", "--watermark", "0 seconds", "--trigger", "500 milliseconds",
           "--option", "maxFilesPerTrigger=1", "--once", "--no-progress"]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SPARKSTATE_JVM_ARCHIVE": archive})
    first = None
    while proc.poll() is None:
        if first is None and (ck / "commits" / "0").exists():
            first = time.monotonic() - started
        time.sleep(0.05)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.read()[-2000:])
    return {"first_batch_s": first, "run_s": time.monotonic() - started}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="runs of each measurement per setting")
    p.add_argument("--out", type=Path, help="JSON of every run (default: benchmarks/results/startup-STAMP.json)")
    args = p.parse_args(argv)

    from sparkstate.jobs.generate import generate_files
    from sparkstate.jvm_archive import archive_path
    from sparkstate.synthetic import StreamConfig

    path = archive_path()
    if path is None or not path.is_file():
        print("no class-data archive for this Java and pyspark: run `sparkstate jvm-archive` first", file=sys.stderr)
        return 2
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sparkstate-startup-") as d:
        work = Path(d)
        generate_files(work / "in", StreamConfig(users=20, seed=5, events=800, rate=0, malformed_share=0.03), files=8)
        for i in range(args.repeats):
            for archive in ("on", "off") if i % 2 == 0 else ("off", "on"):
                runs.append({"what": "session", "archive": archive, **_session(archive)})
                runs.append({"what": "job", "archive": archive, **_job(archive, work)})
                print(runs[-2], runs[-1], flush=True)

    def median(what: str, archive: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["what"] == what and r["archive"] == archive)

    print(f"\nmedians of {args.repeats} runs each (load {os.getloadavg()[0]:.1f} at the end)")
    print(f"{'measure':<28}{'without':>10}{'with':>10}{'ratio':>8}")
    for what, key in (("session", "session_s"), ("session", "first_job_s"), ("job", "first_batch_s"), ("job", "run_s")):
        off, on = median(what, "off", key), median(what, "on", key)
        print(f"{what + ' ' + key:<28}{off:>9.1f}s{on:>9.1f}s{on / off:>8.2f}")
    out = args.out or Path("benchmarks/results") / f"startup-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"archive": str(path), "runs": runs}, indent=1))
    print(f"every run: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
