"""How a batch read its state, as the metrics show it (Spark's RocksDB counters) and as
``state stats`` predicts it from the checkpoint: the batched engine scans a bucket when a batch
touches most of its leaves, and reads leaf by leaf when it touches few."""

from __future__ import annotations

import random

import sparkstate as ss
from sparkstate.observe.metrics import batch_metrics
from tests.streams import LandingDir, StreamRun

KEYS = 6000


def _count(key, rows, state):
    n = (state.get if state.exists else 0) + sum(1 for _ in rows)
    state.update(n)
    yield (key, n)


def test_dense_batches_scan_sparse_batches_read_by_key_and_state_stats_says_where_the_line_is(spark, tmp_path):
    rnd = random.Random(7)
    land = LandingDir(tmp_path / "in")
    everyone = [f"u{i}" for i in range(KEYS)]
    land.add({"key": k} for k in everyone)
    out = ss.flat_map_groups_with_state(land.stream(spark, "key string"), key="key", func=_count,
                                        state_type=int, output_type="key string, n long")
    few = rnd.sample(everyone, 5)
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        run.wait_input()
        land.add({"key": k} for k in rnd.sample(everyone, KEYS))  # every key, shuffled: a dense batch
        run.wait_input()
        land.add({"key": k} for k in few)  # five keys: a sparse batch
        run.wait_input()
        reports = [p for p in run.query.recentProgress if p["numInputRows"]]
        counts = {r.key: r.n for r in run.rows}
    assert [p["numInputRows"] for p in reports] == [KEYS, KEYS, 5]
    assert all(counts[k] == 3 for k in few) and sum(counts.values()) == 2 * KEYS + 5
    first, dense, sparse = (batch_metrics(p, "output") for p in reports)

    # Spark's counters: the dense batch scanned its buckets, the sparse one read a few rows by key
    assert dense.state_reads == "scan" and dense.state_bytes_scanned > 0
    assert sparse.state_reads == "point" and sparse.state_bytes_scanned == 0
    assert 0 < sparse.state_point_reads < dense.state_point_reads
    assert first.state_bytes_scanned == 0  # nothing was stored yet

    # What `state stats` reads from the directories agrees with Spark's row count and places the
    # line between the two batches
    reads = ss.state.stats(spark, tmp_path / "ck").reads
    assert reads["buckets"] + reads["leaves"] == sparse.state_rows
    assert abs(reads["keys_per_leaf"] * reads["leaves"] - KEYS) <= 0.05 * reads["leaves"]  # rounded to 0.1
    assert 5 < reads["scan_from_keys_per_batch"] < KEYS
    assert reads["buckets_read_by_key_only"] == 0
