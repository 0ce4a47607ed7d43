"""Smoke test of ``python -m benchmarks.loop``: the batched engine's per-key loop without Spark.

It must measure the real loop: the processor's outputs equal GroupStateHarness's on the same
input (every batch, and the sessions' final timeouts), and each phase took time. Nothing
about speed is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import loop


@pytest.mark.parametrize("workload", loop.WORKLOADS)
def test_loop_measures_the_processor_and_matches_the_harness(workload: str) -> None:
    r = loop.run(workload, keys=300, batches=2, events_per_key=3, repeats=1)
    assert r["checked"] is True
    assert r["output_rows_checked"] >= 300  # the count: one row per key and batch; sessions: every event ends in one
    for phase in ("group", "load", "loop", "save", "frame", "total"):
        assert r["per_key_us"][phase] > 0, phase
    assert r["per_key_us"]["gc"] >= 0
    assert r["per_key_us"]["total"] >= r["per_key_us"]["loop"]


def test_a_different_input_is_caught() -> None:
    batches = loop.make_batches("sessions", 40, 2, 4)
    key = next(iter(batches[1].data))
    batches[1].data[key] = batches[1].data[key][:-1]  # the harness misses one event the processor gets
    with pytest.raises(AssertionError, match="differ"):
        loop.check("sessions", batches)


def test_command_line_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "loop.json"
    assert loop.main(["--workload", "count", "--keys", "200", "--batches", "1", "--repeats", "1",
                      "--profile", "5", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    [r] = doc["results"]
    assert r["workload"] == "count" and r["per_key_us"]["total"] > 0 and len(r["profile"]) == 5
    assert "total us/key" in capsys.readouterr().out
