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
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F
import pytest

from sparkstate.jobs import JobConfig, run_pipeline
from sparkstate.synthetic.line_server import LineServer
from tests.io.hostile import CSV, KAFKA, LINE, Hostile, draw
from tests.streams import source_scans

DEAD_LETTER_COLUMNS = ("raw", "raw_bytes", "reason", "source", "received_at")
#: A record near the broker's size limit (1 MB by default): truncated JSON, so a dead letter.
NEAR_LIMIT = Hostile("near the size limit", b'{"word": "' + b"x" * 999_000, "dead")


def _replace(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _same(text: str) -> str:
    return text


def _pg_text(text: str) -> str:
    """What PostgreSQL text holds of ``text``: NUL (which it cannot hold) as U+FFFD."""
    return text.replace("\x00", "\ufffd")


def check_dead_letters(rows: list[dict], sent: list[tuple[Hostile, str | None]], text=_same,
                       cut: frozenset[str] = frozenset()) -> set[str]:
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
        if r["source"] in cut:  # too large for one Kafka message: a preview, no raw_bytes
            assert r["raw"] == _replace(h.value)[:1024] + "... [truncated]" and r["raw_bytes"] is None, r["reason"]
            assert r["reason"].endswith(f"; raw_bytes left out: {len(h.value)} bytes do not fit in one Kafka message")
            continue
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


def _kafka_dead_letters(broker, topic: str) -> list[dict]:
    """A ``kafka:`` dead-letter topic read back with a Kafka consumer: each message's JSON value."""
    rows = []
    for msg in broker.consume_all(topic):
        value = json.loads(msg.value().decode("utf-8"))
        # Spark's JSON leaves null columns out: a null value's dead letter has no raw nor raw_bytes.
        assert {"reason", "source", "received_at"} <= set(value) <= set(DEAD_LETTER_COLUMNS), value
        data = value.get("raw_bytes")
        rows.append(dict(value, raw=value.get("raw"), raw_bytes=None if data is None else base64.b64decode(data)))
    return rows


@pytest.mark.timeout(900)
def test_hostile_kafka_records_into_kafka_dead_letters(kafka_spark, kafka_broker, tmp_path):
    """Kafka -> running-count -> parquet (read by pyarrow and pandas), dead letters to a Kafka topic:
    each read back with a Kafka consumer once, its position and reason with it, ``raw_bytes`` (base64) exact."""
    records = draw(KAFKA) + [NEAR_LIMIT, Hostile("not utf-8", b"\xff\xfe\x00\x01 not text", "dead")]
    topic = f"hostile-{uuid.uuid4().hex[:8]}"
    sent = _produce(kafka_broker, topic, records)
    out, dead_topic = tmp_path / "counts", f"{topic}-dead"
    kafka_broker.create_topic(dead_topic, 1)
    result = run_pipeline(kafka_spark, JobConfig(
        "running-count", source=f"kafka:{kafka_broker.bootstrap}/{topic}", sink=f"parquet:{out}",
        deadletter=f"kafka:{kafka_broker.bootstrap}/{dead_topic}", checkpoint=str(tmp_path / "ck"),
        trigger="200 milliseconds", once=True, options={"startingOffsets": "earliest"}))
    assert result.input_rows == len(records)
    rows = _kafka_dead_letters(kafka_broker, dead_topic)
    assert result.dead_letters == len(rows)
    dead = check_dead_letters(rows, sent, cut=frozenset({sent[-2][1]}))
    by_where = {w: h for h, w in sent}
    not_utf8 = [r for r in rows if r["source"] == sent[-1][1]]
    assert [(r["raw_bytes"], r["raw"]) for r in not_utf8] == [(b"\xff\xfe\x00\x01 not text", "\ufffd\ufffd\x00\x01 not text")]
    null_values = [r for r in rows if by_where[r["source"]].value is None]
    assert null_values and all(r["raw"] is None and r["raw_bytes"] is None for r in null_values)
    counts = final_counts((r["word"], r["count"]) for r in _read_parquet_everywhere(out))
    check_counts(counts, sent, dead)


def test_event_time_sessionize_refuses_hostile_kafka_records_in_its_one_read(kafka_spark, kafka_broker, tmp_path):
    """Kafka -> event-time sessionize, which reads the topic once and refuses the malformed records
    itself: a record without a value (a tombstone) is a dead letter whose ``raw`` and ``raw_bytes``
    are null, as the parse writes one; the others carry their exact bytes."""
    from sparkstate.synthetic import generate_events

    events = generate_events(12, users=3, seed=5)
    records = [Hostile("event", e.to_json().encode(), "good") for e in events]
    records[4:4] = [Hostile("null value", None, "dead"), Hostile("not utf-8", b"\xff\xfe{not text", "dead"),
                    Hostile("no user", b'{"event_time": "2024-01-01T00:00:00Z", "data": "x", "is_last": false}', "dead")]
    topic = f"hostile-sessions-{uuid.uuid4().hex[:8]}"
    sent = _produce(kafka_broker, topic, records)
    out, ck = tmp_path / "sessions", tmp_path / "ck"
    result = run_pipeline(kafka_spark, JobConfig(
        "sessionize", source=f"kafka:{kafka_broker.bootstrap}/{topic}", sink=f"parquet:{out}", checkpoint=str(ck),
        trigger="200 milliseconds", once=True, options={"startingOffsets": "earliest"}))
    assert source_scans(ck) == {1}  # one scan of the topic
    assert result.input_rows == len(records)
    rows = _read_parquet_everywhere(out / "_deadletter")
    assert result.dead_letters == len(rows) == 3
    check_dead_letters(rows, sent)
    assert [(r["raw"], r["raw_bytes"]) for r in rows if r["reason"] == "empty record"] == [(None, None)]


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


def _read_json_dead_letters(dead_path: Path) -> list[dict]:
    rows = []
    for f in sorted(dead_path.rglob("*.json")):
        if "_spark_metadata" in f.parts or f.stat().st_size == 0:
            continue
        lines = [json.loads(line) for line in f.read_text(encoding="utf-8").split("\n") if line]
        frame = pd.read_json(f, lines=True)  # pandas reads it too (raw_bytes is base64 in JSON)
        assert len(frame) == len(lines) and {"raw", "raw_bytes", "reason", "source"} <= set(frame.columns)
        rows += [dict(r, raw_bytes=base64.b64decode(r["raw_bytes"])) for r in lines]
    return rows


def check_by_bytes(rows: list[dict], records: list[Hostile], decoded: bool = False) -> None:
    """Dead letters whose ``source`` cannot tell records apart (a file of lines, a socket), matched by bytes.

    ``decoded``: the source decoded the bytes as UTF-8 before sparkstate saw them (a socket), so
    ``raw_bytes`` is the record with each invalid sequence already replaced by U+FFFD.
    """
    def as_read(value: bytes) -> bytes:
        return _replace(value).encode("utf-8") if decoded else value

    assert Counter(bytes(r["raw_bytes"]) for r in rows) <= Counter(as_read(h.value) for h in records)
    assert Counter(as_read(h.value) for h in records if h.expect == "dead") <= Counter(bytes(r["raw_bytes"]) for r in rows)
    for r in rows:
        assert r["reason"] and r["source"]
        assert r["raw"] == _replace(bytes(r["raw_bytes"]))


@pytest.mark.timeout(900)
def test_hostile_csv_files_into_json_dead_letters(spark, tmp_path):
    """CSV files (one hostile record each, so the file is its position) -> parquet, dead letters to json:
    each bad record one dead letter naming its file, with a reason; every good field counted exactly."""
    # ... and a record over the size limit: a dead letter (not typed, its raw cut), not a heap blow-up.
    records = draw(CSV) + [Hostile("over the size limit", b"y" * 1_000_100, "dead")]
    src = tmp_path / "in"
    src.mkdir()
    for i, h in enumerate(records):
        (src / f"r{i:04d}.csv").write_bytes(b"word\n" + h.value + b"\n")
    dead_path = tmp_path / "dead"
    result = run_pipeline(spark, JobConfig(
        "running-count", source=f"files:{src}", format="csv", sink=f"parquet:{tmp_path / 'out'}",
        deadletter=f"json:{dead_path}", checkpoint=str(tmp_path / "ck"), trigger="200 milliseconds", once=True))
    assert result.input_rows == len(records)
    rows = _read_json_dead_letters(dead_path)
    assert result.dead_letters == len(rows)
    by_file = Counter(r["source"].rpartition("/")[2] for r in rows)
    assert [f for f, n in by_file.items() if n > 1] == []
    dead = {int(f[1:5]) for f in by_file}
    assert [i for i, h in enumerate(records) if h.expect == "dead" and i not in dead] == []
    for r in rows:
        h = records[int(r["source"].rpartition("/")[2][1:5])]
        assert h.expect != "good" and r["reason"], (h, r)
        if len(r["raw_bytes"]) > 1_000_000:
            assert r["raw"] == "y" * 1024 + "... [truncated]" and r["reason"].startswith("record is 1000100 bytes")
        else:
            assert r["raw"] == _replace(bytes(r["raw_bytes"]))
        if h.expect == "dead":  # ASCII records: what the reader gives back is the line itself
            assert bytes(r["raw_bytes"]) == h.value, (h, r)
    sent = [(h, str(i)) for i, h in enumerate(records)]
    counts = final_counts((r["word"], r["count"]) for r in _read_parquet_everywhere(tmp_path / "out"))
    check_counts(counts, sent, {str(i) for i in dead})


@pytest.mark.timeout(900)
def test_hostile_file_lines_into_delta_dead_letters(spark, tmp_path):
    """A JSON-lines file of hostile records -> delta dead letters: each sent record once, bytes exact."""
    records = [h for h in draw(LINE) if h.value and b"\n" not in h.value and b"\r" not in h.value and h.value.strip()]
    _write_lines(tmp_path / "in", records)
    dead_path = tmp_path / "dead"
    result = run_pipeline(spark, JobConfig(
        "running-count", source=f"files:{tmp_path / 'in'}", format="json", sink=f"parquet:{tmp_path / 'out'}",
        deadletter=f"delta:{dead_path}", checkpoint=str(tmp_path / "ck"), trigger="200 milliseconds",
        once=True))
    assert result.input_rows == len(records)
    from deltalake import DeltaTable

    table = DeltaTable(str(dead_path)).to_pyarrow_table()
    rows = table.to_pylist()
    table.to_pandas()
    assert len(spark.read.format("parquet").load(str(dead_path)).collect()) >= len(rows)
    assert result.dead_letters == len(rows)
    # A file's dead letters name the file, not the line: match them by their bytes instead.
    check_by_bytes(rows, records)


@pytest.mark.timeout(900)
def test_hostile_socket_lines_into_parquet_dead_letters(spark, tmp_path):
    """JSON lines on a TCP socket (invalid UTF-8 bytes included) -> parquet dead letters, read by pyarrow and
    pandas: each bad line once, naming the socket, with a reason; every good line counted."""
    records = [h for h in draw(LINE) if h.value and b"\n" not in h.value and b"\r" not in h.value and h.value.strip()]
    dead_path = tmp_path / "dead"
    with LineServer([h.value for h in records]) as server:
        result = run_pipeline(spark, JobConfig(
            "running-count", source=f"socket:{server.port}", sink=f"parquet:{tmp_path / 'out'}",
            deadletter=f"parquet:{dead_path}", checkpoint=str(tmp_path / "ck"), trigger="200 milliseconds",
            once=True))
    assert result.input_rows == len(records)
    rows = _read_parquet_everywhere(dead_path)
    assert result.dead_letters == len(rows)
    assert {r["source"] for r in rows} <= {f"socket:127.0.0.1:{server.port}"}
    check_by_bytes(rows, records, decoded=True)
    counts = final_counts((r["word"], r["count"]) for r in _read_parquet_everywhere(tmp_path / "out"))
    assert sum(counts.values()) == len(records) - len(rows)
    want = Counter(h.word for h in records if h.expect == "good")
    assert {w: n for w, n in want.items() if counts.get(w, 0) < n} == {}


@pytest.mark.timeout(900)
def test_hostile_parquet_files_into_json_output(spark, tmp_path):
    """Parquet files of hostile text (NUL, CR/LF, BOM, separators, non-BMP, bytes that are not UTF-8) ->
    running-count -> json output: Parquet is typed already (no dead letters); invalid bytes become U+FFFD;
    every row is counted and the JSON reads back with pandas."""
    words = [h.word for h in draw(LINE) if h.expect == "good"]
    src = tmp_path / "in"
    src.mkdir()
    half = len(words) // 2
    for i, part in enumerate((words[:half], words[half:])):
        pq.write_table(pa.table({"word": pa.array(part, pa.string())}), src / f"part-{i}.parquet")
    # Another writer's strings that are not UTF-8 (pyarrow writes them unchecked as a binary view):
    # the source makes them valid text (U+FFFD), so the JSON output stays readable.
    not_utf8 = [b"a\xffb", b"\xc0\xaf", b"\xed\xa0\x80x"]
    pq.write_table(pa.table({"word": pa.array(not_utf8, pa.binary()).view(pa.string())}), src / "part-2.parquet")
    words += [_replace(w) for w in not_utf8]
    out = tmp_path / "out"
    result = run_pipeline(spark, JobConfig(
        "running-count", source=f"files:{src}", sink=f"json:{out}", checkpoint=str(tmp_path / "ck"),
        trigger="200 milliseconds", once=True))
    assert result.input_rows == len(words) and result.dead_letters == 0
    rows = []
    for f in sorted(out.rglob("*.json")):
        if "_spark_metadata" in f.parts or f.stat().st_size == 0:
            continue
        lines = [json.loads(line) for line in f.read_text(encoding="utf-8").split("\n") if line]
        assert len(pd.read_json(f, lines=True, dtype=False)) == len(lines)
        rows += lines
    assert final_counts((r["word"], r["count"]) for r in rows) == dict(Counter(words))


@pytest.mark.timeout(900)
def test_hostile_file_lines_into_console_dead_letters(spark, tmp_path, capsys):
    """Hostile JSON lines -> console dead letters (what ``sparkstate run --deadletter console`` prints):
    the job runs to its end and stdout shows every dead letter's reason."""
    records = [h for h in draw(LINE) if h.value and b"\n" not in h.value and b"\r" not in h.value and h.value.strip()]
    _write_lines(tmp_path / "in", records)
    result = run_pipeline(spark, JobConfig(
        "running-count", source=f"files:{tmp_path / 'in'}", format="json", sink=f"parquet:{tmp_path / 'out'}",
        deadletter="console", checkpoint=str(tmp_path / "ck"), trigger="200 milliseconds", once=True))
    out = capsys.readouterr().out
    assert result.stopped_by == "caught_up" and result.input_rows == len(records)
    assert "Dead letters, batch" in out
    # The same records in a batch read: the reasons the console must show.
    from sparkstate.io.parse import parse_json

    lines = spark.createDataFrame([(h.value,) for h in records], "value binary").select(
        F.col("value").cast("string").alias("value"))
    reasons = Counter(r.reason for r in parse_json(lines, "word string", source="x").dead_letters.collect())
    assert sum(reasons.values()) == result.dead_letters
    assert reasons and [r for r in reasons if r not in out] == []
    counts = final_counts((r["word"], r["count"]) for r in _read_parquet_everywhere(tmp_path / "out"))
    assert sum(counts.values()) == len(records) - result.dead_letters
