"""Smoke test of the benchmark suite: ``python -m benchmarks.run --quick`` end to end.

It checks that every contender of both workloads ran, measured something and produced the
same output as the Java reference. It asserts nothing about speed: targets live in the
benchmark's output only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from sparkstate.io.connectors import PYSPARK_VERSIONS

from benchmarks.contenders import contenders
from benchmarks.data import Workload
from benchmarks.run import apply_quick, parser, plan

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_measures_every_contender(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    [path] = tmp_path.glob("bench-*.json")
    doc = json.loads(path.read_text())

    expected = {(kind, c.name) for kind in ("count", "sessions") for c in contenders(kind) if c.by_default}
    got = {(r["workload"], r["contender"]): r for r in doc["results"]}
    assert set(got) == expected
    for name, r in got.items():
        assert r["error"] is None, (name, r["error"])
        assert r["events_per_s"] > 0, name
        assert r["steady_events_per_s"] > 0 and r["steady_batches"] >= 1, name
        assert r["events"] == r["params"]["total_events"], name
        assert r["state_rows"] > 0, name
        assert r["p50_ms"] is not None and r["p95_ms"] >= r["p50_ms"], name
        assert r["memory"]["jvm_mb"] > 0, name
        assert r["output_matches_reference"] is True, name
        assert r["ratio_to_reference"] > 0 and r["steady_ratio_to_reference"] > 0, name
    assert "| contender" in done.stdout and "steady ev/s" in done.stdout and str(path) in done.stdout


def test_sweep_plan_covers_the_grid_within_the_event_budget() -> None:
    cells, skipped = plan(parser().parse_args(["--sweep", "--workload", "count", "--max-events", "10M"]))
    grid = {(c.spec.keys, c.spec.events_per_key) for c in cells} | {(s["keys"], s["events_per_key"]) for s in skipped}
    assert grid == {(k, e) for k in (1_000, 100_000, 1_000_000, 10_000_000) for e in (1, 10, 100)}
    assert all(c.spec.total_events <= 10_000_000 for c in cells)
    assert all(c.spec.events_per_key_per_batch == c.spec.events_per_key for c in cells)


def test_standard_workload_layout() -> None:
    w = Workload("count", keys=50_000, events=1_000_000)
    assert (w.files, w.files_per_trigger, w.batches, w.total_events, w.distinct_keys) == (8, 2, 4, 1_000_000, 50_000)


def test_steady_and_high_cardinality_plan() -> None:
    cells, _ = plan(parser().parse_args(["--steady", "--high-cardinality", "--workload", "all"]))
    assert {(c.workload, c.spec.keys) for c in cells} == {(k, n) for k in ("count", "sessions") for n in (50_000, 1_000_000)}
    for c in cells:
        assert c.spec.batches == 21 and c.spec.batch_events == 250_000, c.spec
    big = next(c.spec for c in cells if c.spec.keys == 1_000_000)
    assert big.touched == 250_000 and big.distinct_keys == 1_000_000  # every key seen, once per 4 batches

    args = parser().parse_args(["--quick", "--high-cardinality"])
    apply_quick(args)
    cells, _ = plan(args)
    assert sorted({c.spec.keys for c in cells}) == [500, 4_000]  # the tiny stand-in for 1M


def test_the_3_5_figures_plan() -> None:
    """`make bench-35`'s cells: count and sessions at 50K and 1M keys with Java, raw
    applyInPandasWithState and the inband engine, then the state cost at 100K and 10M keys in
    state with the contenders whose preload is not a per-key Python call (not pyspark-pandas)."""
    args = parser().parse_args(["--workload", "all", "--high-cardinality", "--scaling",
                                "--contenders", "java", "pyspark-pandas", "sparkstate-inband"])
    cells, _ = plan(args)
    got = {(c.workload, getattr(c.spec, "keys", None) or c.spec.state_keys): [x.name for x in c.contenders]
           for c in cells}
    assert got == {
        ("count", 50_000): ["java-mgws", "pyspark-pandas", "sparkstate-inband"],
        ("count", 1_000_000): ["java-mgws", "pyspark-pandas", "sparkstate-inband"],
        ("sessions", 50_000): ["java-fmgws", "pyspark-pandas", "sparkstate-inband"],
        ("sessions", 1_000_000): ["java-fmgws", "pyspark-pandas", "sparkstate-inband"],
        ("scaling", 100_000): ["java-mgws", "sparkstate-inband"],
        ("scaling", 10_000_000): ["java-mgws", "sparkstate-inband"],
    }
    assert all(c.spec.touched == 10_000 for c in cells if c.workload == "scaling")
    # --scaling alone is the scaling run only, and a contender named there runs whatever its preload
    alone, _ = plan(parser().parse_args(["--scaling", "--contenders", "pyspark-pandas"]))
    assert [(c.workload, [x.name for x in c.contenders]) for c in alone] == [("scaling", ["pyspark-pandas"])] * 2


def test_a_contender_this_minor_lacks_is_left_out_of_the_list() -> None:
    every = {(c.workload, c.name): c for kind in ("count", "sessions") for c in contenders(kind, every_minor=True)}
    here = {(c.workload, c.name) for kind in ("count", "sessions") for c in contenders(kind)}
    assert here == {k for k, c in every.items() if c.available}
    assert replace(every[("count", "pyspark-tws")], needs=(99, 0)).available is False
    # the raw applyInPandasWithState contenders and the engine of 3.5 run on every supported minor
    for key in [("count", "pyspark-pandas"), ("sessions", "pyspark-pandas"), ("count", "sparkstate-inband"),
                ("sessions", "sparkstate-inband"), ("count", "java-mgws"), ("sessions", "java-fmgws")]:
        assert every[key].needs is None and key in here, key


def test_pyspark_3_5_runs_in_its_venv_or_says_how_to_make_it() -> None:
    from tests.versions import venvs

    done = subprocess.run([sys.executable, "-m", "benchmarks.run", "--pyspark", "3.5", "--list"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if venvs.python(PYSPARK_VERSIONS["3.5"][0]).exists():
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.splitlines()
        assert lines[0] == "PySpark 3.5"
        left_out = {tuple(ln.split()[:2]) for ln in lines[1:] if "left out: needs PySpark" in ln}
        assert left_out == {("count", "pyspark-tws"), ("count", "sparkstate-tws"), ("count", "sparkstate-batched"),
                            ("count", "sparkstate-vectorized"), ("sessions", "pyspark-tws"),
                            ("sessions", "sparkstate-tws"), ("sessions", "sparkstate-batched"),
                            ("sessions", "sparkstate-perkey"), ("sessions", "sparkstate-emit-nopack")}
    else:
        assert done.returncode == 2 and "python -m tests.versions.venvs" in done.stderr
