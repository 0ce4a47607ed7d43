"""``python -m benchmarks.run``: every contender on the same input, in turn; tables and a JSON file.

The protocol of ``../shared/design/performance.md``: generated Parquet input read as a stream
``--files-per-trigger`` files per micro-batch, ``local[2]``, 2 shuffle partitions, RocksDB,
noop sink, each query timed from ``start()`` to its end (SparkSession start excluded), first
micro-batch left out of the batch-duration percentiles. See benchmarks/README.md.
``--pyspark 3.5`` runs the same command in that minor's venv (the version matrix's).

>>> count_arg("50K"), count_arg("1M"), count_arg("2_500"), count_arg("1e6")
(50000, 1000000, 2500, 1000000)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Iterator

from sparkstate.engines.runtime import pyspark_minor
from sparkstate.io.connectors import PYSPARK_VERSIONS

from . import data, jvm, report
from .contenders import Contender, contenders, select
from .measure import load_average
from .runner import ROOT, Task, bench_config, execute, start_session, task_json

SWEEP_KEYS = (1_000, 100_000, 1_000_000, 10_000_000)
#: The standard input: 1M events in 4 micro-batches of 250K.
STANDARD_EVENTS, STANDARD_BATCHES = 1_000_000, 4
#: --steady: one warm-up micro-batch, then this many, each of the standard batch's size.
STEADY_BATCHES = 20
#: --high-cardinality without a number (and its size in --quick).
HIGH_CARDINALITY, QUICK_HIGH_CARDINALITY = 1_000_000, 4_000
SWEEP_EVENTS_PER_KEY = (1, 10, 100)
WORKLOADS = ("count", "sessions")


def count_arg(text: str) -> int:
    """A count: ``50000``, ``50_000``, ``50K``, ``1M``, ``1e6``."""
    t = text.strip().replace("_", "").upper()
    scale = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(t[-1:], 1)
    if scale != 1:
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count like 50000, 50K or 1M, got {text!r}") from None
    if value < 1 or not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a positive whole count, got {text!r}")
    return int(value)


def conf_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Benchmark sparkstate against the JVM and raw PySpark on the same streams.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    w = p.add_argument_group("workload")
    w.add_argument("--workload", action="append", choices=[*WORKLOADS, "all"],
                   help="running count and/or event-time sessionization (repeatable; default: count)")
    w.add_argument("--keys", nargs="+", type=count_arg, default=[50_000], help="distinct keys (several: one run each)")
    w.add_argument("--events", type=count_arg,
                   help=f"events in the input (default {data.human(STANDARD_EVENTS)}; with --steady"
                        f" {STEADY_BATCHES + 1} x {data.human(STANDARD_EVENTS // STANDARD_BATCHES)})")
    w.add_argument("--events-per-key", nargs="+", type=count_arg,
                   help="events per touched key per micro-batch (default: events spread evenly over the keys)")
    w.add_argument("--files", type=int, default=8, help="Parquet files in the input")
    w.add_argument("--files-per-trigger", type=int, default=2, help="files read per micro-batch")
    w.add_argument("--batches", type=int, help="micro-batches in the input (sets --files to batches x files-per-trigger)")
    w.add_argument("--steady", action="store_true",
                   help=f"a long-running job's view: 1 warm-up + {STEADY_BATCHES} micro-batches of the standard batch"
                        f" size (--batches {STEADY_BATCHES + 1}); the steady events/s column is over the"
                        f" {STEADY_BATCHES}")
    w.add_argument("--high-cardinality", nargs="?", type=count_arg, const=HIGH_CARDINALITY, metavar="KEYS",
                   help=f"add a cell with KEYS keys (default {data.human(HIGH_CARDINALITY)}) to --keys; at the"
                        " standard batch size (250K events) each micro-batch touches 250K of them once")
    w.add_argument("--sweep", action="store_true",
                   help=f"keys {', '.join(map(data.human, SWEEP_KEYS))} x events/key/batch"
                        f" {', '.join(map(str, SWEEP_EVENTS_PER_KEY))}; events per cell max(--events, keys x"
                        " events/key), cells above --max-events skipped")
    w.add_argument("--max-events", type=count_arg, default=10_000_000, help="largest sweep cell")
    s = p.add_argument_group("state-size scaling (running count)")
    s.add_argument("--scaling", action="store_true",
                   help="batch duration with --state-keys keys already in state, --touched keys per batch"
                        " (alone: only that; with --workload: after the workloads' cells)")
    s.add_argument("--state-keys", nargs="+", type=count_arg, default=[100_000, 10_000_000])
    s.add_argument("--touched", type=count_arg, default=10_000, help="keys touched per micro-batch")
    s.add_argument("--scaling-batches", type=int, default=5, help="timed micro-batches after the preload")
    s.add_argument("--preload", choices=["auto", "batches"], default="auto",
                   help="auto: through an initial state where the contender takes one, else by the first"
                        " micro-batches; batches: by the first micro-batches for every contender")
    s.add_argument("--preload-batches", type=int, default=1,
                   help="micro-batches that read every state key once, when the state is preloaded by batches")
    r = p.add_argument_group("run")
    r.add_argument("--pyspark", choices=sorted(PYSPARK_VERSIONS), metavar="MINOR",
                   help="run in the venv of this PySpark minor (tests/versions/venvs.py; made by"
                        " `python -m tests.versions.venvs`), this checkout's sources first; default: this Python's")
    r.add_argument("--contenders", nargs="+", metavar="NAME", help="only contenders whose name starts so (see --list)")
    r.add_argument("--quick", action="store_true",
                   help="a small smoke run of both workloads (< 2 minutes), one SparkSession, outputs verified")
    r.add_argument("--isolation", choices=["process", "session"],
                   help="process: a fresh SparkSession (JVM) per contender (default); session: one for all (--quick)")
    r.add_argument("--verify", action="store_true",
                   help="collect every output and compare it with the reference contender's (slower: not for numbers)")
    r.add_argument("--conf", action="append", type=conf_arg, default=[], metavar="KEY=VALUE",
                   help="an extra Spark setting for every contender (repeatable)")
    r.add_argument("--timeout", type=float, default=3600, help="seconds per contender")
    r.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="JSON results and logs go here")
    r.add_argument("--data-dir", type=Path, help="generated inputs are cached here (default: OUT/data)")
    r.add_argument("--list", action="store_true", help="list the contenders and exit")
    return p


@dataclass(frozen=True)
class Cell:
    """One input and the contenders that run on it."""

    workload: str  # count | sessions | scaling
    spec: data.Workload | data.Scaling
    contenders: tuple[Contender, ...]


def apply_quick(args: argparse.Namespace) -> None:
    """``--quick``: tiny inputs, both workloads, one session, outputs verified."""
    args.workload = args.workload or ["all"]
    args.batches = 6 if args.steady else 2  # --steady in --quick: 1 warm-up + 5
    args.keys, args.events, args.files_per_trigger = [500], 2_000 * args.batches, 2
    if args.high_cardinality:
        args.high_cardinality = QUICK_HIGH_CARDINALITY
    args.events_per_key, args.sweep = None, False
    args.state_keys, args.touched, args.scaling_batches = [2_000, 20_000], 500, 3
    args.preload_batches = min(args.preload_batches, 2)
    args.isolation = args.isolation or "session"
    args.verify = True
    args.timeout = min(args.timeout, 300)


def input_layout(args: argparse.Namespace) -> tuple[int, int]:
    """(events, files) of every cell: ``--batches`` / ``--steady`` set the files, and without
    ``--events`` a --steady input keeps the standard batch size (250K events) for its 21 batches.

    >>> input_layout(parser().parse_args([]))
    (1000000, 8)
    >>> input_layout(parser().parse_args(["--steady"]))
    (5250000, 42)
    >>> input_layout(parser().parse_args(["--batches", "10", "--events", "2M", "--files-per-trigger", "1"]))
    (2000000, 10)
    """
    batches = args.batches or (STEADY_BATCHES + 1 if args.steady else None)
    files = args.files if batches is None else batches * args.files_per_trigger
    events = args.events
    if events is None:
        events = STANDARD_EVENTS if batches is None else STANDARD_EVENTS // STANDARD_BATCHES * batches
    return events, files


def scaling_cells(args: argparse.Namespace, alone: bool) -> list[Cell]:
    """The state-size scaling cells. Run ``alone``, a contender named with --contenders is in
    them even if its preload is slow (``in_scaling`` false); after the workloads' cells, not."""
    picked = select(contenders("count"), args.contenders)
    chosen = tuple(c for c in picked if c.in_scaling or (alone and args.contenders))
    return [Cell("scaling", data.Scaling(n, args.touched, args.scaling_batches, preload_batches=args.preload_batches),
                 chosen) for n in args.state_keys] if chosen else []


def plan(args: argparse.Namespace) -> tuple[list[Cell], list[dict]]:
    cells: list[Cell] = []
    skipped: list[dict] = []
    events, files = input_layout(args)
    if args.scaling and not args.workload:
        return scaling_cells(args, alone=True), skipped
    kinds = WORKLOADS if "all" in (args.workload or []) else tuple(dict.fromkeys(args.workload or ["count"]))
    for kind in kinds:
        chosen = tuple(select(contenders(kind), args.contenders))
        if not chosen:
            continue
        common = dict(files=files, files_per_trigger=args.files_per_trigger)
        if args.sweep:
            for keys in SWEEP_KEYS:
                for epk in SWEEP_EVENTS_PER_KEY:
                    n = max(events, keys * epk)
                    if n > args.max_events:
                        skipped.append({"workload": kind, "keys": keys, "events_per_key": epk, "events": n,
                                        "reason": f"needs {n:,} events > --max-events {args.max_events:,}"})
                        continue
                    cells.append(Cell(kind, data.Workload(kind, keys, n, epk, **common), chosen))
        else:
            keys_list = list(dict.fromkeys([*args.keys, *([args.high_cardinality] if args.high_cardinality else [])]))
            for keys in keys_list:
                for epk in args.events_per_key or [None]:
                    cells.append(Cell(kind, data.Workload(kind, keys, events, epk, **common), chosen))
    if args.scaling:
        cells += scaling_cells(args, alone=False)
    return cells, skipped


def _run_text(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=30)
        return (done.stdout or done.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict:
    import pyspark

    from sparkstate.spark import default_config

    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "pyspark": pyspark.__version__,
        "java": _run_text(["java", "-version"]).splitlines()[0:1],
        "git": _run_text(["git", "rev-parse", "--short", "HEAD"]),
        "git_dirty": bool(_run_text(["git", "status", "--porcelain"])),
        "sparkstate_defaults": default_config(),
    }


@contextlib.contextmanager
def spark_output_to(log: Path) -> Iterator[IO[str]]:
    """Point fds 1 and 2 (inherited by the JVM and its Python workers) at ``log``; yield the terminal."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    console = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield console
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)
        console.close()


def _in_child(task: Task, logs: Path, n: int) -> dict:
    """Run ``task`` in a fresh Python process (its own SparkSession and JVM)."""
    with tempfile.TemporaryDirectory(prefix="sparkstate-bench-task-") as tmp:
        task_file, result_file = Path(tmp) / "task.json", Path(tmp) / "result.json"
        task_file.write_text(task_json(task))
        log = logs / f"{n:03d}-{task.workload}-{task.contender}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with open(log, "w") as out:
            try:
                done = subprocess.run([sys.executable, "-m", "benchmarks.runner", str(task_file), str(result_file)],
                                      cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=task.timeout_s + 300)
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        if result_file.exists():
            return json.loads(result_file.read_text())
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])[:800]
        return {"contender": task.contender, "workload": task.workload, "error": f"runner exited ({code}): {tail}",
                "events_per_s": None, "log": str(log)}


def _tasks(cell: Cell, source: Path | data.ScalingInput, base: Task) -> Iterator[Task]:
    for c in cell.contenders:
        if isinstance(source, data.ScalingInput):
            path, preload, fpt = source.touched, str(source.with_preload), 1
        else:
            path, preload, fpt = source, None, cell.spec.files_per_trigger
        yield replace(base, contender=c.name, workload=cell.workload, params=cell.spec.as_dict(),
                      source=str(path), preload_source=preload, files_per_trigger=fpt,
                      verify=base.verify and cell.workload != "scaling")


def _line(r: dict) -> str:
    if r.get("error"):
        return f"  {r['contender']:<24} FAILED: {r['error'][:300]}"
    p50 = "-" if r.get("p50_ms") is None else f"{r['p50_ms']:.0f}"
    return (f"  {r['contender']:<24} {report._rate(r.get('events_per_s')):>7} events/s"
            f"   steady {report._rate(r.get('steady_events_per_s')):>7} ({r.get('steady_batches', 0)} batches)"
            f"   p50 {p50:>6} ms"
            f"   {r.get('seconds', 0):.1f} s   load {r.get('load_after')}")


def _check_outputs(results: list[dict]) -> None:
    ref = next((r for r in results if r.get("reference") and r.get("output_digest")), None)
    for r in results:
        if r.get("output_digest") and ref:
            r["output_matches_reference"] = r["output_digest"] == ref["output_digest"]


def in_minor_venv(minor: str, argv: list[str]) -> int:
    """Run ``python -m benchmarks.run ARGV`` in PySpark ``minor``'s venv (the version matrix's,
    never made or changed here), this checkout's ``benchmarks`` and ``src`` first on its path and
    its Spark cache the venv's (as the matrix runs it); return its exit code."""
    from tests.versions import venvs

    version = PYSPARK_VERSIONS[minor][0]
    python = venvs.python(version)
    if not python.exists():
        print(f"no venv for pyspark {version} at {venvs.venv_dir(version)}: make it with"
              " `python -m tests.versions.venvs`", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["SPARKSTATE_CACHE"] = str(venvs.venv_dir(version) / "cache")
    return subprocess.call([str(python), "-m", "benchmarks.run", *argv], env=env)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    here = "{}.{}".format(*pyspark_minor())
    if args.pyspark and args.pyspark != here:
        return in_minor_venv(args.pyspark, list(argv if argv is not None else sys.argv[1:]))
    if args.quick:
        apply_quick(args)
    args.isolation = args.isolation or "process"
    cells, skipped = plan(args)
    if args.list:
        print(f"PySpark {here}")
        for kind in WORKLOADS:
            for c in contenders(kind, every_minor=True):
                lacks = "" if c.available else f"  (left out: needs PySpark {c.needs[0]}.{c.needs[1]})" if c.needs else ""
                print(f"{kind:<9} {c.name:<24} {c.family:<10} {c.description}{lacks}")
        return 0
    if not cells:
        print("nothing to run: no contender matches --contenders", file=sys.stderr)
        return 2
    out: Path = args.out
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    logs = out / "logs" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    json_path = out / f"bench-{stamp}.json"
    cache = args.data_dir or out / "data"
    extra = dict(args.conf)
    doc = {
        "started": stamp, "command": ["python", "-m", "benchmarks.run", *(argv if argv is not None else sys.argv[1:])],
        "isolation": args.isolation, "verify": args.verify, "load_at_start": load_average(),
        "uptime_at_start": _run_text(["uptime"]), "machine": machine(), "skipped": skipped, "results": [],
    }
    print(f"sparkstate benchmarks: {len(cells)} input(s), isolation={args.isolation}; load {load_average()}")
    for s in skipped:
        print(f"  skipped {s['workload']} keys={data.human(s['keys'])} events/key={s['events_per_key']}: {s['reason']}")
    with tempfile.TemporaryDirectory(prefix="sparkstate-bench-") as tmp:
        jar = None
        if any(c.name.startswith("java") for cell in cells for c in cell.contenders):
            jar = str(jvm.build_jar(Path(tmp)))
            print(f"compiled the Java reference ({', '.join(p.name for p in jvm.JAVA_SOURCES.rglob('*.java'))})")
        doc["config"] = bench_config(jar, extra)
        sources = []
        for cell in cells:
            print(f"input: {cell.spec.label()}")
            gen = data.generate_scaling if cell.workload == "scaling" else data.generate
            sources.append(gen(cell.spec, cache))
        base = Task("", "", {}, "", 1, str(Path(tmp) / "work"), args.timeout, jar, extra, args.verify,
                    preload=args.preload)
        with contextlib.ExitStack() as stack:
            console: IO[str] = sys.stdout
            spark = None
            if args.isolation == "session":
                console = stack.enter_context(spark_output_to(logs / "spark.log"))
                spark = start_session(jar, extra)
                stack.callback(spark.stop)
            n = 0
            for cell, source in zip(cells, sources):
                print(f"\n{cell.spec.label()}", file=console)
                cell_results = []
                for task in _tasks(cell, source, base):
                    n += 1
                    result = execute(spark, task) if spark is not None else _in_child(task, logs, n)
                    result["cell"] = cell.spec.slug()
                    cell_results.append(result)
                    doc["results"].append(result)
                    print(_line(result), file=console)
                    report.write_json(json_path, doc)
                if cell.workload != "scaling":
                    report.add_ratios(cell_results)
                    _check_outputs(cell_results)
                report.write_json(json_path, doc)
    doc["finished"] = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    doc["load_at_end"], doc["uptime_at_end"] = load_average(), _run_text(["uptime"])
    report.write_json(json_path, doc)
    print_tables(doc)
    print(f"\nJSON: {json_path}\nlogs: {logs}")
    failed = [r for r in doc["results"] if r.get("error") or r.get("output_matches_reference") is False]
    return 1 if failed else 0


def print_tables(doc: dict) -> None:
    by_cell: dict[str, list[dict]] = {}
    for r in doc["results"]:
        by_cell.setdefault(r["cell"], []).append(r)
    scaling = [r for r in doc["results"] if r["workload"] == "scaling"]
    for results in by_cell.values():
        if results[0]["workload"] == "scaling":
            continue
        print(f"\n### {results[0].get('label', results[0]['cell'])}\n")
        print(report.table(results))
        mismatched = [r["contender"] for r in results if r.get("output_matches_reference") is False]
        if mismatched:
            print(f"\noutput differs from the reference: {', '.join(mismatched)}")
    if scaling:
        print(f"\n### state-size scaling: {scaling[0]['params']['touched']:,} keys touched per batch\n")
        print(report.scaling_table(scaling))
    print(f"\nload average at start {doc['load_at_start']}, at end {doc.get('load_at_end')}"
          f" ({doc['machine']['cores']} cores)")


if __name__ == "__main__":
    sys.exit(main())
