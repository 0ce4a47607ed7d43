"""Hostile bytes in, every record accounted for, every file and table readable (issue 29).

Hypothesis draws the hostile records up front (tests/io/hostile.py: a fixed seed, a bounded
count; ``make fuzz`` raises it), and one stream per source/sink pairing carries them all. Each
stream must finish (the job never stops), every ``"dead"`` record must be exactly one dead letter
with its position and a reason, every ``"good"`` one must be counted in the output, and what was
written must read back with pyarrow, pandas and the sink's own reader, with each dead letter's
``raw`` valid text and its ``raw_bytes`` the record's exact bytes.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sparkstate.jobs import JobConfig, run_pipeline
from tests.io.hostile import KAFKA, LINE, Hostile, draw

#: A record near the broker's size limit (1 MB by default): truncated JSON, so a dead letter.
NEAR_LIMIT = Hostile("near the size limit", b'{"word": "' + b"x" * 999_000, "dead")


def _replace(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _same(text: str) -> str:
    return text


def _pg_text(text: str) -> str:
    """What PostgreSQL text holds of ``text``: NUL (which it cannot hold) as U+FFFD."""
    return text.replace("\x00", "\ufffd")


def check_dead_letters(rows: list[dict], sent: list[tuple[Hostile, str | None]], text=_same) -> set[str]:
    """``rows`` (raw, raw_bytes, reason, source) against ``sent`` (record, where); returns the dead positions.

    Every dead letter is a record that was sent, once, with a reason; every ``"dead"`` record is one;
    ``raw`` is the record as valid text (invalid bytes replaced), ``raw_bytes`` its exact bytes.
    """
    by_where = {w: h for h, w in sent}
    seen = Counter(r["source"] for r in rows)
    assert [w for w, n in seen.items() if n > 1] == []
    for r in rows:
        assert r["source"] in by_where, r
        h = by_where[r["source"]]
        assert r["reason"], r
        assert (bytes(r["raw_bytes"]) if r["raw_bytes"] is not None else None) == h.value, (h, r)
        if h.value is None:
            assert r["raw"] is None
        elif len(h.value) > 1_000_000:
            assert r["raw"].endswith("... [truncated]")
        else:
            assert r["raw"] == text(_replace(h.value)), (h, r)
        assert h.expect != "good", (h, r)
    missing = [h for h, w in sent if h.expect == "dead" and w not in seen]
    assert missing == []
    return set(seen)


def check_counts(counts: dict[str, int], sent: list[tuple[Hostile, str | None]], dead: set[str], text=_same) -> None:
    """Every record that is not a dead letter is counted once in the output; every good word is there."""
    processed = [h for h, w in sent if w not in dead]
    assert sum(counts.values()) == len(processed)
    want = Counter(text(h.word) for h in processed if h.expect == "good")
    assert {w: n for w, n in want.items() if counts.get(w, 0) < n} == {}


def final_counts(rows) -> dict[str, int]:
    """running-count's update-mode rows (word, count): each word's last, largest count."""
    out: dict[str, int] = {}
    for word, count in rows:
        out[word] = max(out.get(word, 0), count)
    return out


def _produce(broker, topic: str, records: list[Hostile]) -> list[tuple[Hostile, str]]:
    broker.create_topic(topic, 1)
    # Keys that are not the value's word (nor valid UTF-8): the pipeline reads the value only.
    keys = [None if i % 3 == 0 else bytes([0xFF, i % 256, 0x00]) for i in range(len(records))]
    where = broker.produce(topic, [(k, h.value) for k, h in zip(keys, records)], partition=0)
    return [(h, f"kafka:{topic}/{p}@{o}") for h, (p, o) in zip(records, where)]


def _read_parquet_everywhere(path: Path) -> list[dict]:
    """The rows of a Parquet directory, read with pyarrow (rows and pandas) and pandas; all must agree."""
    files = [f for f in path.rglob("*.parquet") if not any(p.startswith(("_", ".")) for p in f.relative_to(path).parts)]
    table = pq.read_table(files) if files else None
    rows = table.to_pylist() if table is not None else []
    if files:
        table.to_pandas()
        frame = pd.read_parquet(path)
        assert len(frame) == len(rows)
    return rows


@pytest.mark.timeout(900)
def test_hostile_kafka_records_into_parquet_dead_letters(kafka_spark, kafka_broker, tmp_path):
    """Kafka -> running-count -> parquet, dead letters to parquet: readable by pyarrow and pandas, bytes exact."""
    records = draw(KAFKA) + [NEAR_LIMIT, Hostile("not utf-8", b"\xff\xfe\x00\x01 not text", "dead")]
    topic = f"hostile-{uuid.uuid4().hex[:8]}"
    sent = _produce(kafka_broker, topic, records)
    out, dead_dir = tmp_path / "counts", tmp_path / "dead"
    result = run_pipeline(kafka_spark, JobConfig(
        "running-count", source=f"kafka:{kafka_broker.bootstrap}/{topic}", sink=f"parquet:{out}",
        deadletter=f"parquet:{dead_dir}", checkpoint=str(tmp_path / "ck"), trigger="200 milliseconds", once=True,
        options={"startingOffsets": "earliest"}))
    assert result.input_rows == len(records)
    rows = _read_parquet_everywhere(dead_dir)
    assert result.dead_letters == len(rows)
    dead = check_dead_letters(rows, sent)
    frame = pd.read_parquet(dead_dir)
    not_utf8 = frame[frame["source"] == sent[-1][1]]
    assert not_utf8["raw_bytes"].tolist() == [b"\xff\xfe\x00\x01 not text"]
    assert not_utf8["raw"].tolist() == ["\ufffd\ufffd\x00\x01 not text"]
    counts = final_counts((r["word"], r["count"]) for r in _read_parquet_everywhere(out))
    check_counts(counts, sent, dead)


@pytest.mark.timeout(900)
def test_hostile_kafka_records_into_postgres(kafka_spark, kafka_broker, postgres_server, tmp_path):
    """Kafka -> running-count -> postgres, dead letters to postgres: NULs and invalid bytes fail no batch;
    psql and psycopg read every row; ``raw_bytes`` (bytea) holds the exact bytes."""
    records = draw(KAFKA) + [Hostile("not utf-8", b"\xff\xfe\x00\x01 not text", "dead"),
                             Hostile("NUL in a word", b'{"word": "a\\u0000b"}', "good", "a\x00b")]
    topic = f"hostile-pg-{uuid.uuid4().hex[:8]}"
    sent = _produce(kafka_broker, topic, records)
    table = f"counts_{uuid.uuid4().hex[:8]}"
    result = run_pipeline(kafka_spark, JobConfig(
        "running-count", source=f"kafka:{kafka_broker.bootstrap}/{topic}", sink=f"postgres:{postgres_server.url}/{table}",
        deadletter=f"postgres:{postgres_server.url}/{table}_dead", checkpoint=str(tmp_path / "ck"),
        trigger="200 milliseconds", once=True, options={"startingOffsets": "earliest"}))
    assert result.input_rows == len(records)
    got = postgres_server.query(f"SELECT raw, raw_bytes, reason, source FROM {table}_dead")
    assert result.dead_letters == len(got)
    # PostgreSQL text cannot hold NUL: raw has U+FFFD in its place; raw_bytes keeps it.
    rows = [{"raw": raw, "raw_bytes": data, "reason": reason, "source": source} for raw, data, reason, source in got]
    dead = check_dead_letters(rows, sent, text=_pg_text)
    counts = final_counts(postgres_server.query(f"SELECT word, count FROM {table}"))
    assert counts.get("a\ufffdb", 0) >= 1
    check_counts(counts, sent, dead, text=_pg_text)
    # psql reads every row, the non-UTF-8 record's included (its bytes shown as bytea hex).
    psql = postgres_server._bin / "psql"
    shown = subprocess.run([str(psql), postgres_server.url, "-At", "-c",
                            f"SELECT encode(raw_bytes, 'hex'), raw FROM {table}_dead WHERE source = '{sent[-2][1]}'"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "fffe0001206e6f742074657874|\ufffd\ufffd\ufffd\x01 not text"


def _write_lines(path: Path, records: list[Hostile]) -> list[tuple[Hostile, str | None]]:
    path.mkdir(parents=True)
    (path / "part-0.json").write_bytes(b"\n".join(h.value for h in records) + b"\n")
    return [(h, None) for h in records]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dead_sink", ["json", "delta"])
def test_hostile_file_lines_into_file_dead_letters(spark, tmp_path, dead_sink):
    """A JSON-lines file of hostile records -> json or delta dead letters: each sent record once, bytes exact."""
    records = [h for h in draw(LINE) if h.value and b"\n" not in h.value and b"\r" not in h.value and h.value.strip()]
    sent = _write_lines(tmp_path / "in", records)
    dead_path = tmp_path / "dead"
    result = run_pipeline(spark, JobConfig(
        "running-count", source=f"files:{tmp_path / 'in'}", format="json", sink=f"parquet:{tmp_path / 'out'}",
        deadletter=f"{dead_sink}:{dead_path}", checkpoint=str(tmp_path / "ck"), trigger="200 milliseconds",
        once=True))
    assert result.input_rows == len(records)
    if dead_sink == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(str(dead_path)).to_pyarrow_table()
        rows = table.to_pylist()
        table.to_pandas()
        assert len(spark.read.format("parquet").load(str(dead_path)).collect()) >= len(rows)
    else:
        rows = []
        for f in sorted(dead_path.rglob("*.json")):
            if "_spark_metadata" in f.parts or f.stat().st_size == 0:
                continue
            lines = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines()]
            frame = pd.read_json(f, lines=True)  # pandas reads it too (raw_bytes is base64 in JSON)
            assert len(frame) == len(lines) and {"raw", "raw_bytes", "reason", "source"} <= set(frame.columns)
            rows += [dict(r, raw_bytes=base64.b64decode(r["raw_bytes"])) for r in lines]
    assert result.dead_letters == len(rows)
    # A file's dead letters name the file, not the line: match them by their bytes instead.
    assert Counter(bytes(r["raw_bytes"]) for r in rows) <= Counter(h.value for h in records)
    assert Counter(h.value for h in records if h.expect == "dead") <= Counter(bytes(r["raw_bytes"]) for r in rows)
    for r in rows:
        assert r["reason"] and r["source"]
        assert r["raw"] == _replace(bytes(r["raw_bytes"]))
