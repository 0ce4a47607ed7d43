"""``python -m benchmarks.months``: months of event time through sessionize, in bounded wall time.

The generator with a daily cycle (:mod:`sparkstate.synthetic.stream`, ``cycle=daily``): in each
47-minute round of event time only the users active at that time of day click (from
``--trough`` of ``--users`` at 04:00 UTC up to all of them at 16:00), and the population moves on
by ``--churn`` users a day, so ``--days`` days meet ``users + days * churn`` users. The job is
the one ``sparkstate run sessionize`` runs (event time, 1-minute gap, Parquet sink), on the
whole stream at once (``rate=0``) in micro-batches of ``--per-batch`` events: weeks of event
time go by in minutes. A micro-batch reads events in event-time order, so none is behind the
watermark.

Watched while it runs: every few seconds the state on disk and the processes' memory. Afterwards
the keys in state at every micro-batch the checkpoint still holds (Spark keeps the last 100)
are read from it, and checked (exit code 1 if a check fails):

==================  =====================================================================
``expired_state``   at every state sample and at the end, the keys in state are exactly the
                    users whose session is still open by the reference at that batch
``follows_active``  at every sample the keys in state are at most the users active in the
                    rounds between the batch's watermark and its last event (a session never
                    spans two rounds, so a key of an earlier round would be a leak), and the
                    most keys ever in state is at most half the users met
``output_exact``    the sessions in the sink are the reference's: none lost, duplicated or made up
==================  =====================================================================

The figures per hour of day (keys in state against users active) show the state following the
daily cycle; ``months.json`` keeps everything (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .soak import Check, Sampler, StateSample, batch_offsets, last_commit, run_job, verify_state_and_output

QUERY_NAME = "sparkstate_months"


@dataclass(frozen=True)
class MonthsConfig:
    """A months run: the generator's daily cycle, how many days of event time, batch size."""

    days: float = 90.0
    users: int = 60
    churn: int = 6
    trough: float = 0.1
    seed: int = 5
    gap: str = "1 minute"
    watermark: str = "10 seconds"
    per_batch: int = 20_000
    sample_every_s: float = 5.0

    @property
    def generator(self) -> str:
        return (f"users={self.users},seed={self.seed},gap={self.gap},cycle=daily,trough={self.trough:g},"
                f"churn={self.churn}")

    @property
    def stream(self) -> Any:
        from sparkstate.synthetic import StreamConfig

        return StreamConfig.from_options(dict(kv.split("=", 1) for kv in self.generator.split(",")) | {"rate": "1"})

    @property
    def events(self) -> int:
        """Records covering ``days`` days of event time: every round that starts before the end."""
        from sparkstate.synthetic.stream import DAY_MS, _round_offsets

        cfg = self.stream
        rounds = math.ceil(self.days * DAY_MS / cfg.round_span_ms)
        return _round_offsets(cfg, rounds=rounds)[rounds]

    @property
    def source(self) -> str:
        return f"generator:rate=0,events={self.events},{self.generator}"


def _hour(ms: int) -> float:
    return (ms % 86_400_000) / 3_600_000


def follow_figures(config: MonthsConfig, marks: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """For each ``(end index, watermark ms)``: users met so far, the users active in the rounds
    from the watermark's to the last event's, and the active share at the watermark."""
    from sparkstate.synthetic.stream import active_share, active_users, instant_ms, stream_records

    cfg = config.stream
    start = instant_ms(cfg.start)
    span = cfg.round_span_ms
    order = sorted(range(len(marks)), key=lambda i: marks[i][0])
    out: list[dict[str, Any]] = [{} for _ in marks]
    seen: set[str] = set()
    pos, last_ms = 0, start
    for i in order:
        end, watermark = marks[i]
        while pos < end:
            stop = min(end, pos + 50_000)
            for r in stream_records(cfg, pos, stop):
                seen.add(r.event.user_id)
                last_ms = max(last_ms, instant_ms(r.event.event_time))
            pos = stop
        r_lo = max(0, (watermark - start) // span)
        r_hi = max(r_lo, (last_ms - start) // span)
        active = set()
        for r in range(r_lo, r_hi + 1):
            active.update(active_users(cfg, r))
        out[i] = {"users_met": len(seen), "active_bound": len(active), "hour": round(_hour(watermark), 2),
                  "active_share": round(active_share(cfg, watermark), 3),
                  "active_now": len(active_users(cfg, max(0, (watermark - start) // span))),
                  "day": round((watermark - start) / 86_400_000, 2)}
    return out


def read_states(spark: Any, checkpoint: Path, path: Path) -> list[StateSample]:
    """The keys in state at every batch the checkpoint still holds but the last (checked on its own)."""
    import sparkstate as ss

    last = last_commit(checkpoint)
    batches = sorted(int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")) if last is not None else []
    out = []
    for b in batches[:-1]:
        t0 = time.monotonic()
        try:
            keys = {r[0] for r in ss.state.read(spark, str(checkpoint), b).select("user_id").collect()}
        except Exception:  # a version Spark's retention has deleted meanwhile
            continue
        end_index, watermark_ms = batch_offsets(checkpoint, b)
        s = StateSample(time.time(), b, end_index, watermark_ms, keys, round(time.monotonic() - t0, 2))
        out.append(s)
        with open(path, "a") as f:
            f.write(json.dumps({"batch": b, "end_index": end_index, "watermark_ms": watermark_ms,
                                "keys": len(keys)}) + "\n")
    return out


@dataclass
class MonthsResult:
    ok: bool
    summary: dict[str, Any]
    checks: list[Check]


def run_months(spark: Any, config: MonthsConfig, out: Path, work: Path | None = None,
               log: Callable[[str], None] = lambda s: None) -> MonthsResult:
    """Run the whole stream through sessionize (``once``), then check and summarise it into ``out``."""
    from sparkstate.jobs import JobConfig

    out.mkdir(parents=True, exist_ok=True)
    metrics, samples_path, state_path = out / "metrics.jsonl", out / "samples.jsonl", out / "state_samples.jsonl"
    for p in (metrics, samples_path, state_path):
        p.unlink(missing_ok=True)
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="sparkstate-months-")
        work = Path(tmp.name)
    try:
        ck, sink = work / "checkpoint", work / "sessions"
        events = config.events
        job = JobConfig("sessionize", source=config.source, sink=f"parquet:{sink}", checkpoint=str(ck),
                        gap=config.gap, time_mode="event", watermark=config.watermark, trigger="1 second",
                        metrics=str(metrics), query_name=QUERY_NAME, once=True,
                        options={"maxEventsPerTrigger": str(config.per_batch)})
        shown = [time.monotonic()]

        def on_batch(m: Any, totals: Any) -> None:
            if m.query == "output" and time.monotonic() - shown[0] >= 30:
                shown[0] = time.monotonic()
                log(f"  batch {m.batch_id:>4}  events {totals.rows_in:>10,} of {events:,}  watermark {m.watermark}"
                    f"  batch {m.batch_duration_ms} ms")

        sampler = Sampler(ck, samples_path, config.sample_every_s)
        started = time.monotonic()
        with sampler:
            result = run_job(spark, job, on_batch, log)
        seconds = round(time.monotonic() - started, 1)
        log(f"  done in {seconds:.0f} s ({result.batches} batches); checking against the reference")
        states = read_states(spark, ck, state_path)
        verified = verify_state_and_output(spark, config, ck, sink, states)
        checks = verified.pop("checks")
        batch = last_commit(ck)
        end_mark = batch_offsets(ck, batch) if batch is not None else (0, 0)
        marks = [(s.end_index, s.watermark_ms) for s in states] + [end_mark]
        figures = follow_figures(config, marks)
        rows = [{"batch": s.batch, "keys": len(s.keys)} | f for s, f in zip(states, figures)]
        rows.append({"batch": batch, "keys": verified.get("state_keys"), "final": True} | figures[-1])
        over = [r for r in rows if r["keys"] is not None and r["keys"] > r["active_bound"]]
        users_met = figures[-1]["users_met"]
        most = max((r["keys"] or 0 for r in rows), default=0)
        checks.append(Check(
            "follows_active", bool(rows) and not over and most * 2 <= users_met,
            f"{len(rows)} samples: keys in state above the users active since the watermark's round in {len(over)};"
            f" most keys in state {most} of {users_met} users met ({config.users} in the population at a time)"))
        by_hour = []
        for lo in range(0, 24, 4):
            part = [r for r in rows if lo <= r["hour"] < lo + 4 and r["keys"] is not None]
            if part:
                by_hour.append({"hours": f"{lo:02d}-{lo + 4:02d}", "samples": len(part),
                                "keys_mean": round(statistics.fmean(r["keys"] for r in part), 1),
                                "active_mean": round(statistics.fmean(r["active_now"] for r in part), 1)})
        disk = [json.loads(line) for line in samples_path.read_text().splitlines()] if samples_path.exists() else []
        points = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] \
            if metrics.exists() else []
        points = [p for p in points if p.get("query", "output") == "output"]
        summary = {
            "config": asdict(config), "source": config.source, "events": events, "seconds": seconds,
            "batches": result.batches, "input_rows": result.input_rows, "sessions": result.output_rows,
            "timed_out": result.timed_out, "final_watermark": result.final_watermark,
            "days_of_event_time": figures[-1]["day"], "users_met": users_met, "state_keys_max": most,
            "state_samples": len(states),
            "samples": rows, "by_hour": by_hour,
            "batch_ms_p50": _p(points, "batch_duration_ms", 50), "batch_ms_p95": _p(points, "batch_duration_ms", 95),
            "rows_in_max": max((p.get("rows_in") or 0 for p in points), default=0),
            "state_disk_mb": _thirds([d["state_disk_bytes"] / 1e6 for d in disk]),
            "jvm_mb": _thirds([d.get("jvm_mb", 0) for d in disk]),
            "python_workers_mb": _thirds([d.get("python_workers_mb", 0) for d in disk]),
            "state_memory_mb": _thirds([(p.get("state_memory_bytes") or 0) / 1e6 for p in points]),
            "verify": verified, "checks": [asdict(c) for c in checks], "ok": all(c.ok for c in checks),
        }
        (out / "months.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return MonthsResult(summary["ok"], summary, checks)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _p(points: list[dict], key: str, q: float) -> float | None:
    values = sorted(p[key] for p in points if p.get(key) is not None)
    if not values:
        return None
    return float(values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))])


def _thirds(values: list[float]) -> dict[str, float | None]:
    """Mean of each third of a series, and its maximum."""
    n = len(values)
    parts = [values[: n // 3], values[n // 3: 2 * n // 3], values[2 * n // 3:]]
    out: dict[str, float | None] = {name: round(statistics.fmean(p), 2) if p else None
                                    for name, p in zip(("first", "middle", "last"), parts)}
    out["max"] = round(max(values), 2) if values else None
    return out


def main(argv: list[str] | None = None) -> int:
    from .run import machine, spark_output_to
    from .runner import start_session

    d = MonthsConfig()
    p = argparse.ArgumentParser(prog="python -m benchmarks.months", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--days", type=float, default=d.days, help="days of event time")
    p.add_argument("--users", type=int, default=d.users, help="users in the population at a time")
    p.add_argument("--churn", type=int, default=d.churn, help="users replaced per day")
    p.add_argument("--trough", type=float, default=d.trough, help="share of users active at 04:00 UTC")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--per-batch", type=int, default=d.per_batch, help="events per micro-batch (maxEventsPerTrigger)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="an extra Spark setting")
    p.add_argument("--out", type=Path, help="results directory (default: benchmarks/results/months-STAMP)")
    args = p.parse_args(argv)
    config = MonthsConfig(args.days, args.users, args.churn, args.trough, args.seed, per_batch=args.per_batch)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("benchmarks/results") / f"months-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"sparkstate months: sessionize on {config.days:g} days of a daily cycle ({config.events:,} events);"
          f" results in {out}")
    with spark_output_to(out / "spark.log") as console:
        spark = start_session(None, dict(c.split("=", 1) for c in args.conf))
        try:
            result = run_months(spark, config, out, log=lambda line: print(line, file=console, flush=True))
        finally:
            spark.stop()
    s = result.summary
    s["machine"], s["command"] = machine(), ["python", "-m", "benchmarks.months", *(argv or sys.argv[1:])]
    (out / "months.json").write_text(json.dumps(s, indent=2, default=str) + "\n")
    print(f"\n{s['days_of_event_time']:.1f} days of event time, {s['input_rows']:,} events in {s['batches']} batches,"
          f" {s['seconds']:.0f} s; {s['users_met']:,} users met, at most {s['state_keys_max']} keys in state"
          f" ({s['state_samples']} samples); load {os.getloadavg()[0]:.1f}")
    for row in s["by_hour"]:
        print(f"  {row['hours']} UTC: keys in state {row['keys_mean']:>7} (mean of {row['samples']}),"
              f" users active {row['active_mean']}")
    for c in result.checks:
        print(f"  {'ok  ' if c.ok else 'FAIL'} {c.name:<15} {c.detail}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
