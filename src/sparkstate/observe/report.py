"""Plots and a short text summary of a run, from its metrics file (one JSON line per batch).

>>> import json, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> lines = [{"query": "output", "batch_id": i, "time": f"2024-01-01T00:00:0{i}.000Z", "rows_in": 10 * i,
...           "processed_rows_per_s": 100.0 * i, "batch_duration_ms": 200 + i, "state_rows": i,
...           "state_memory_bytes": 1000 * i, "dead_letters": 0} for i in range(1, 4)]
>>> _ = (d / "m.jsonl").write_text("".join(json.dumps(x) + "\\n" for x in lines))
>>> r = write_report(d / "m.jsonl", d / "report")
>>> [p.name for p in r.images], r.batches, r.rows_in
(['throughput.png', 'batch_duration.png', 'state_size.png'], 3, 60)
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .metrics import STAGES


@dataclass(frozen=True)
class Report:
    """What :func:`write_report` produced."""

    images: list[Path]
    summary_path: Path
    summary: str
    batches: int
    rows_in: int


def _load(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"report: metrics file {path} does not exist; write one with `sparkstate run ... --metrics FILE`")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"report: line {n} of {path} is not JSON ({exc.msg})") from None
    out = [r for r in records if r.get("query", "output") == "output"]
    if not out:
        raise ConfigError(f"report: {path} has no batch records of the output query")
    return out


def _num(values: list[Any]) -> list[float]:
    return [float(v) if v is not None else float("nan") for v in values]


def write_report(metrics: str | os.PathLike, out_dir: str | os.PathLike) -> Report:
    """Draw throughput, batch duration and state size over the batches; write ``summary.txt``."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("report: plotting needs matplotlib: pip install 'sparkstate[report]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = _load(Path(metrics))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    batches = [r["batch_id"] for r in records]
    charts = [
        ("throughput.png", "Throughput", "rows per second",
         [("processed", _num([r.get("processed_rows_per_s") for r in records])),
          ("input", _num([r.get("input_rows_per_s") for r in records]))]),
        ("batch_duration.png", "Batch duration", "milliseconds",
         [("duration", _num([r.get("batch_duration_ms") for r in records]))]),
        ("state_size.png", "State size", "state store rows",
         [("keys", _num([r.get("state_rows") for r in records]))]),
    ]
    images = []
    for name, title, ylabel, series in charts:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for label, ys in series:
            ax.plot(batches, ys, marker=".", label=label)
        if name == "state_size.png":
            mem = _num([r.get("state_memory_bytes") for r in records])
            ax2 = ax.twinx()
            ax2.plot(batches, [m / 1e6 for m in mem], color="tab:red", linestyle="--", label="memory (MB)")
            ax2.set_ylabel("state memory (MB)")
        ax.set_title(title)
        ax.set_xlabel("micro-batch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        images.append(out / name)

    durations = [r["batch_duration_ms"] for r in records if r.get("batch_duration_ms") is not None]
    rows_in = sum(int(r.get("rows_in") or 0) for r in records)
    with_data = [r for r in records if r.get("rows_in")]
    rates = [r["processed_rows_per_s"] for r in with_data if r.get("processed_rows_per_s")]
    states = [r["state_rows"] for r in records if r.get("state_rows") is not None]
    lines = [
        f"batches: {len(records)} ({len(with_data)} with data)",
        f"rows in: {rows_in}",
        f"dead letters: {sum(int(r.get('dead_letters') or 0) for r in records)}",
    ]
    if durations:
        q = statistics.quantiles(durations, n=20) if len(durations) > 1 else [durations[0]] * 19
        lines.append(f"batch duration ms: p50 {statistics.median(durations):.0f}, p95 {q[18]:.0f}, max {max(durations)}")
    if rates:
        lines.append(f"processed rows/s (batches with data): median {statistics.median(rates):.0f}, max {max(rates):.0f}")
    if states:
        lines.append(f"state store rows: first {states[0]}, last {states[-1]}, max {max(states)}")
    parts = {name: [r[name] for r in with_data if isinstance(r.get(name), (int, float))] for name in STAGES}
    if all(parts.values()):
        lines.append("batch time by stage, p50 ms (batches with data): " + ", ".join(
            f"{name.removesuffix('_ms').replace('_', ' ')} {statistics.median(values):.0f}"
            for name, values in parts.items()))
    reads = [r.get("state_reads") for r in with_data if r.get("state_reads")]
    if reads:
        lines.append(f"state reads (batches with data): {reads.count('scan')} by scan, {reads.count('point')} by key only,"
                     f" {reads.count('none')} read nothing")
    summary = "\n".join(lines) + "\n"
    summary_path = out / "summary.txt"
    summary_path.write_text(summary)
    return Report(images, summary_path, summary, len(records), rows_in)
