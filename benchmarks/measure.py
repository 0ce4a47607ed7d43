"""Measurements: batch durations and state size from query progress, memory from /proc.

Memory: :class:`TreeSampler` samples, every ``interval`` seconds while a query runs, the
process tree under the benchmark's Python driver: the driver itself, the JVM it launched, and
the Python workers the JVM forks. For the Python processes it reads PSS
(``/proc/<pid>/smaps_rollup``, shared pages split between the processes sharing them, so forked
workers are not counted twice), falling back to RSS where PSS is unreadable. For the JVM it
reads RSS (``/proc/<pid>/status``): the JVM shares next to nothing with the other processes,
and walking its large address space for PSS takes the kernel's memory-map lock, which slowed
the very query being measured (several seconds per run on 2 cores). Peaks are per group and of
the total at one sample instant.

>>> s = summarize_batches([{"batchId": b, "numInputRows": n, "durationMs": {"triggerExecution": ms}}
...                        for b, (n, ms) in enumerate([(10, 900), (10, 100), (10, 200), (10, 300), (0, 50)])])
>>> s["p50_ms"], s["steady_events_per_s"], s["steady_batches"]
(150.0, 50.0, 3)
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from sparkstate.observe.metrics import batch_metrics

_PROC = Path("/proc")


def _stat(pid: str) -> tuple[str, int] | None:
    try:
        text = (_PROC / pid / "stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1: text.rindex(")")]
    ppid = int(text[text.rindex(")") + 2:].split()[1])
    return comm, ppid


def _memory_kb(pid: int, pss: bool = True) -> int:
    sources = (("smaps_rollup", "Pss:"), ("status", "VmRSS:")) if pss else (("status", "VmRSS:"),)
    for name, field in sources:
        try:
            for line in (_PROC / str(pid) / name).read_text().splitlines():
                if line.startswith(field):
                    return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return 0


def process_tree(root: int) -> dict[int, str]:
    """``{pid: comm}`` of ``root`` and all its descendants."""
    parents: dict[int, list[tuple[int, str]]] = {}
    comm_of: dict[int, str] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        st = _stat(entry.name)
        if st is None:
            continue
        pid = int(entry.name)
        comm_of[pid] = st[0]
        parents.setdefault(st[1], []).append((pid, st[0]))
    tree = {root: comm_of.get(root, "?")}
    todo = [root]
    while todo:
        for pid, comm in parents.get(todo.pop(), ()):
            tree[pid] = comm
            todo.append(pid)
    return tree


class SamplingLoop:
    """A daemon thread calling ``sample`` at once, then every ``interval()`` seconds until
    stopped, and once more then (a context manager)."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def interval(self) -> float:
        raise NotImplementedError

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval()):
            self.sample()

    def __enter__(self) -> "SamplingLoop":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


class TreeSampler(SamplingLoop):
    """Peak memory (MB) of the Python driver, the JVM and the Python workers under ``root``."""

    GROUPS = ("python_driver", "jvm", "python_workers")

    def __init__(self, root: int | None = None, interval: float = 0.25) -> None:
        super().__init__("bench-memory-sampler")
        self.root = root or os.getpid()
        self.every = interval
        self.peak_kb = {g: 0 for g in self.GROUPS} | {"total": 0}
        self.samples = 0

    def interval(self) -> float:
        return self.every

    def _group(self, pid: int, comm: str) -> str | None:
        if pid == self.root:
            return "python_driver"
        if comm == "java":
            return "jvm"
        if comm.startswith("python") or comm.startswith("pyspark"):
            return "python_workers"
        # The spark-class shell, and short-lived helpers the JVM spawns processes through
        # (jspawnhelper): the latter briefly share the JVM's pages and would count it twice.
        return None

    def current_kb(self) -> dict[str, int]:
        """The memory (kB) of each group now."""
        now = {g: 0 for g in self.GROUPS}
        for pid, comm in process_tree(self.root).items():
            group = self._group(pid, comm)
            if group is not None:
                now[group] += _memory_kb(pid, pss=group != "jvm")
        return now

    def sample(self) -> None:
        now = self.current_kb()
        for g, kb in now.items():
            self.peak_kb[g] = max(self.peak_kb[g], kb)
        self.peak_kb["total"] = max(self.peak_kb["total"], sum(now.values()))
        self.samples += 1

    def result(self) -> dict:
        out = {f"{g}_mb": round(kb / 1024, 1) for g, kb in self.peak_kb.items()}
        return out | {"samples": self.samples, "interval_s": self.every, "measure": "peak PSS of Python processes, RSS of the JVM"}


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def steady_rate(batches: list[dict], warmup: int = 1) -> tuple[float | None, int]:
    """Steady-state events/s: the rows of the batches after the first ``warmup`` (worker
    start, RocksDB open, JIT; a state preload) over the sum of their ``triggerExecution``, and how many batches
    that is. Trailing batches without input (an event-time query's final no-data batch, which
    ``availableNow`` adds to fire what is left) are not in it: a long-running job never sees them."""
    timed = batches[warmup:]
    while timed and not timed[-1]["rows"]:
        timed = timed[:-1]
    ms = sum(b["ms"] or 0 for b in timed)
    rows = sum(b["rows"] or 0 for b in timed)
    if not timed or ms <= 0:
        return None, len(timed)
    return round(rows / (ms / 1000), 1), len(timed)


def _state_ops(p: dict) -> dict:
    """A batch's state-store figures, summed over its stateful operators (when it has any): the
    commit time and the rows written, which tell a batch's state cost from the rest, and how
    the batch read its state (scan or by key)."""
    ops = p.get("stateOperators") or []
    if not ops:
        return {}
    m = batch_metrics(p, "output")  # how it read its state: Spark's RocksDB counters
    return {"commit_ms": sum(op.get("commitTimeMs") or 0 for op in ops),
            "rows_updated": sum(op.get("numRowsUpdated") or 0 for op in ops),
            "state_reads": m.state_reads, "state_point_reads": m.state_point_reads,
            "state_bytes_scanned": m.state_bytes_scanned}


def summarize_batches(progress: list[dict], warmup: int = 1) -> dict:
    """Batch list, p50/p95 of ``triggerExecution`` with the first ``warmup`` batches excluded,
    and the steady-state rate (:func:`steady_rate`)."""
    batches = [
        {"batch": p.get("batchId"), "rows": p.get("numInputRows", 0),
         "ms": (p.get("durationMs") or {}).get("triggerExecution"), **_state_ops(p)}
        for p in progress
    ]
    timed = [b["ms"] for b in batches[warmup:] if b["ms"] is not None]
    steady = steady_rate(batches, warmup)
    return {
        "batches": batches,
        "p50_ms": _percentile(timed, 50),
        "p95_ms": _percentile(timed, 95),
        "timed_batches": len(timed),
        "warmup_batches": warmup,
        "steady_events_per_s": steady[0],
        "steady_batches": steady[1],
    }


def state_size(progress: list[dict]) -> dict:
    """State rows and bytes after the last batch that reported state operators (summed)."""
    for p in reversed(progress):
        ops = p.get("stateOperators") or []
        if ops:
            custom: dict[str, int] = {}
            for op in ops:
                for k, v in (op.get("customMetrics") or {}).items():
                    if isinstance(v, (int, float)):
                        custom[k] = custom.get(k, 0) + v
            return {
                "state_rows": sum(op.get("numRowsTotal", 0) for op in ops),
                "state_memory_bytes": sum(op.get("memoryUsedBytes", 0) for op in ops),
                "state_sst_bytes": custom.get("rocksdbSstFileSize"),
                "state_operators": [op.get("operatorName") for op in ops],
            }
    return {"state_rows": None, "state_memory_bytes": None, "state_sst_bytes": None, "state_operators": []}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
