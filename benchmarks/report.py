"""The results as Markdown tables (stdout) and as one JSON file.

>>> rows = [{"contender": "java-mgws", "reference": True, "events_per_s": 50_000.0, "p50_ms": 900.0,
...          "steady_events_per_s": 80_000.0, "steady_batches": 20,
...          "p95_ms": 1000.0, "state_rows": 10, "state_memory_bytes": 2_000_000, "memory": {}},
...         {"contender": "sparkstate-tws", "reference": False, "events_per_s": 10_000.0, "p50_ms": 4000.0,
...          "steady_events_per_s": 20_000.0, "steady_batches": 20,
...          "p95_ms": 4100.0, "state_rows": 10, "state_memory_bytes": 2_000_000, "memory": {}}]
>>> add_ratios(rows)
>>> rows[1]["ratio_to_reference"], rows[1]["steady_ratio_to_reference"]
(0.2, 0.25)
>>> print(table(rows).splitlines()[3])
| sparkstate-tws | 10.0K | 0.20x | 20.0K | 0.25x | 20 | 4000 | 4100 | 10 | 1.9 | - | - | - |  |
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable


def add_ratios(results: list[dict]) -> None:
    """Set ``ratio_to_reference``: events/s over the reference contender's, same cell."""
    ref = next((r for r in results if r.get("reference") and r.get("events_per_s")), None)
    for r in results:
        eps = r.get("events_per_s")
        r["ratio_to_reference"] = round(eps / ref["events_per_s"], 3) if (ref and eps) else None
        r["reference_contender"] = ref["contender"] if ref else None
        steady, ref_steady = r.get("steady_events_per_s"), (ref or {}).get("steady_events_per_s")
        r["steady_ratio_to_reference"] = round(steady / ref_steady, 3) if (steady and ref_steady) else None


def _rate(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1_000_000:
        return f"{v / 1_000_000:.2f}M"
    if v >= 1_000:
        return f"{v / 1_000:.1f}K"
    return f"{v:.0f}"


def _num(v: Any, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _mb(v: Any) -> str:
    return "-" if v is None else f"{v / 1024 / 1024:.1f}"


def _markdown(header: list[str], rows: Iterable[list[str]], right: set[int]) -> str:
    rows = [header] + list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def line(r: list[str]) -> str:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        return "| " + " | ".join(cells) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else "-" * w for i, w in enumerate(widths)) + " |"
    return "\n".join([line(rows[0]), rule] + [line(r) for r in rows[1:]])


def _note(r: dict) -> str:
    if r.get("error"):
        return "FAILED: " + r["error"][:160]
    notes = []
    if r.get("reference"):
        notes.append("reference")
    elif r.get("output_matches_reference") is not None:
        notes.append("same output" if r["output_matches_reference"] else "OUTPUT DIFFERS from the reference")
    for k, v in (r.get("conf") or {}).items():
        notes.append(f"{v} state" if k.endswith("encodingFormat") else f"{k.rsplit('.', 1)[-1]}={v}")
    return "; ".join(notes)


def table(results: list[dict]) -> str:
    """One cell's contenders: throughput (whole run, and steady after the first batch), batch
    durations, state, peak memory."""
    header = ["contender", "events/s", "x ref", "steady ev/s", "x ref steady", "steady batches", "p50 ms",
              "p95 ms", "state rows", "state MB", "JVM MB", "py workers MB", "total MB", "notes"]
    rows = []
    for r in results:
        mem = r.get("memory") or {}
        ratio, steady_ratio = r.get("ratio_to_reference"), r.get("steady_ratio_to_reference")
        rows.append([
            r["contender"], _rate(r.get("events_per_s")), "-" if ratio is None else f"{ratio:.2f}x",
            _rate(r.get("steady_events_per_s")), "-" if steady_ratio is None else f"{steady_ratio:.2f}x",
            _num(r.get("steady_batches")),
            _num(r.get("p50_ms")), _num(r.get("p95_ms")), _num(r.get("state_rows"), "{:,}"),
            _mb(r.get("state_memory_bytes")), _num(mem.get("jvm_mb")), _num(mem.get("python_workers_mb")),
            _num(mem.get("total_mb")), _note(r),
        ])
    return _markdown(header, rows, right=set(range(1, 13)))


def scaling_table(results: list[dict]) -> str:
    """Per contender: p50 batch duration at each state size, and the growth smallest -> largest."""
    sizes = sorted({r["params"]["state_keys"] for r in results})
    by: dict[str, dict[int, dict]] = {}
    for r in results:
        by.setdefault(r["contender"], {})[r["params"]["state_keys"]] = r
    from .data import human

    header = ["contender", "preload"] + [f"p50 ms @{human(s)}" for s in sizes] + ["growth", "notes"]
    rows = []
    for name, cells in by.items():
        p50 = [cells.get(s, {}).get("p50_ms") for s in sizes]
        growth = f"{p50[-1] / p50[0]:.2f}x" if len(sizes) > 1 and p50[0] and p50[-1] else "-"
        errors = "; ".join(f"@{human(s)}: {c['error'][:100]}" for s, c in cells.items() if c.get("error"))
        preload = next(iter(cells.values())).get("preload", "")
        rows.append([name, preload] + [_num(v) for v in p50] + [growth, errors])
    return _markdown(header, rows, right=set(range(2, 3 + len(sizes))))


def write_json(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=1, default=str))
    tmp.replace(path)
