"""The latency benchmark's bookkeeping, without Spark or Kafka: markers and percentiles."""

import json

from benchmarks.latency import Workload, partition_of, summarize


def test_a_count_result_names_the_nth_event_of_its_key():
    w = Workload("count", keys=3, seed=1)
    values = [json.loads(w.event("u00001")[0]) for _ in range(3)]
    assert [w.input_marker(v, n) for n, v in enumerate(values, 1)] == [1, 2, 3]
    assert Workload.marker_of("count", {"word": "u00001", "count": 3}) == 3


def test_a_session_result_names_its_flagged_last_event():
    w = Workload("sessions", keys=3, seed=1)
    value, marker = w.event("u00002", last=True)
    event = json.loads(value)
    assert marker == event["data"] == w.input_marker(event, 1)
    unflagged, none = w.event("u00002", last=False)
    assert none is None and w.input_marker(json.loads(unflagged), 2) is None
    session = {"user_id": "u00002", "events": ["e0", event["data"]], "closed_by": "last_event"}
    assert Workload.marker_of("sessions", session) == event["data"]
    assert Workload.marker_of("sessions", {**session, "closed_by": "timeout"}) is None


def test_percentiles_are_nearest_rank():
    s = summarize([float(v) for v in range(1, 101)])
    assert (s["n"], s["p50"], s["p95"], s["p99"], s["max"]) == (100, 50.0, 95.0, 99.0, 100.0)
    assert summarize([])["p50"] is None


def test_a_key_always_goes_to_the_same_partition():
    assert {partition_of("u00007") for _ in range(5)} == {partition_of("u00007")}
