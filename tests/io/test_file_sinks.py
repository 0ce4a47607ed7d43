"""File sinks (``parquet:DIR``, ``json:DIR``) read by Spark, pandas, pyarrow and DuckDB alike, after a replay.

In-process, on real Spark and real files: what a crash leaves in a sink directory is put there by
hand (files of a batch moved into place whose log entry and commit never came, a 0-byte part file
of an older release's file sink, a half-written staging file), then the query restarts on its
checkpoint. The kills themselves are in ``tests/reliability/test_file_sink_crash.py``.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from sparkstate.io.files import STAGING_DIR, part_name
from sparkstate.io.sinks import parse_sink, start_sink
from tests.io.readers import READERS, read_everywhere, read_with
from tests.io.replay import drop_last_commit
from tests.streams import LandingDir

SCHEMA = "user_id string, n long"


def _rows(n0: int, n: int) -> list[dict]:
    return [{"user_id": f"u{i % 3}", "n": i} for i in range(n0, n0 + n)]


def _run(spark, landing: LandingDir, spec: str, ck, mode: str = "append") -> None:
    query = start_sink(landing.stream(spark, SCHEMA), parse_sink(spec), checkpoint=ck, output_mode=mode)
    query.processAllAvailable()
    query.stop()


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_files_of_attempts_that_did_not_commit_are_gone_before_the_batch_is_redone(spark, tmp_path, fmt):
    landing, out, ck = LandingDir(tmp_path / "in"), tmp_path / "out", tmp_path / "ck"
    for k in range(3):
        landing.add(_rows(10 * k, 4))
    _run(spark, landing, f"{fmt}:{out}", ck)
    first = Counter(("u%d" % (i % 3), i) for k in range(3) for i in range(10 * k, 10 * k + 4))
    assert read_everywhere(spark, out, fmt, ["user_id", "n"], SCHEMA) == {r: first for r in READERS}
    ext = ".snappy.parquet" if fmt == "parquet" else ".json"
    assert sorted(p.name for p in out.glob("part-*")) == [part_name(b, 0, ext) for b in range(3)]  # one file a batch

    # A crash after batch 2's files were moved into place, before its log entry and its commit:
    replayed = drop_last_commit(ck)
    for name in (str(replayed), f".{replayed}.crc"):
        (out / "_spark_metadata" / name).unlink(missing_ok=True)
    # ... a 0-byte part file of an older release (Spark's file sink killed while writing in place) ...
    legacy = out / f"part-00000-{uuid.uuid4()}-c000{ext}"
    legacy.write_bytes(b"")
    # ... and a task file cut short in the staging directory.
    task = out / STAGING_DIR / f"batch_id={replayed}-dead" / "_temporary" / "0" / "_temporary" / "attempt_0"
    task.mkdir(parents=True)
    (task / f"part-00000-x.c000.{fmt}").write_bytes(b"PAR1")
    # What readers see now: Spark what the log lists; the others whole files, batch 2 included (and, for
    # a reader that meets the 0-byte file, a failure: the defect the restart must clear).
    spark_rows = read_with("spark", spark, out, fmt, ["user_id", "n"], SCHEMA)
    assert spark_rows == first - Counter(("u%d" % (i % 3), i) for i in range(20, 24))
    if fmt == "parquet":
        with pytest.raises(Exception, match="0 bytes|too small|empty"):
            read_with("pyarrow", spark, out, fmt, ["user_id", "n"])

    landing.add(_rows(100, 5))
    _run(spark, landing, f"{fmt}:{out}", ck)  # batch 2 again, then batch 3

    want = first + Counter(("u%d" % (i % 3), i) for i in range(100, 105))
    assert read_everywhere(spark, out, fmt, ["user_id", "n"], SCHEMA) == {r: want for r in READERS}
    assert not legacy.exists()
    assert [p for p in (out / STAGING_DIR).rglob("*") if p.is_file()] == []
    assert len(list(out.glob(f"part-{replayed:010d}-*"))) == 1  # written again under the same name


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_update_mode_a_batch_directory_killed_while_moved_is_written_again(spark, tmp_path, fmt):
    landing, out, ck = LandingDir(tmp_path / "in"), tmp_path / "out", tmp_path / "ck"
    for k in range(2):
        landing.add(_rows(10 * k, 3))
    _run(spark, landing, f"{fmt}:{out}", ck, "update")
    cols = ["batch_id", "user_id", "n"]
    first = Counter((k, "u%d" % (i % 3), i) for k in range(2) for i in range(10 * k, 10 * k + 3))
    assert read_everywhere(spark, out, fmt, cols, batches=True) == {r: first for r in READERS}

    # A crash while batch 1's directory was moved into place (an object store copies file by file):
    # its _SUCCESS not written yet, and a staged attempt left behind.
    replayed = drop_last_commit(ck)
    (out / f"batch_id={replayed}" / "_SUCCESS").unlink()
    (out / STAGING_DIR / f"batch_id={replayed}-dead").mkdir(parents=True)
    (out / STAGING_DIR / f"batch_id={replayed}-dead" / f"part-00000-x.c000.{fmt}").write_bytes(b"")
    landing.add(_rows(100, 2))
    _run(spark, landing, f"{fmt}:{out}", ck, "update")

    want = first + Counter((2, "u%d" % (i % 3), i) for i in range(100, 102))
    assert read_everywhere(spark, out, fmt, cols, batches=True) == {r: want for r in READERS}
    assert [p for p in (out / STAGING_DIR).rglob("*") if p.is_file()] == []
    assert all((out / f"batch_id={b}" / "_SUCCESS").exists() for b in range(3))


def test_an_empty_batch_is_logged_in_the_background_and_a_lost_entry_is_given_back(spark, tmp_path):
    """A batch known to be empty (``rows=0``, as a job's dead letters usually are) gets its log
    entry written in the background; ``flush`` waits for it. A crash that lost such an entry
    (the batch committed, its entry not yet written) leaves a gap below the next batch: the writer
    fills it with empty entries, so that Spark's reader, which needs every entry, reads the sink."""
    from sparkstate.io.files import SINK_LOG_DIR, FileSinkLog

    out = tmp_path / "out"
    rows = spark.createDataFrame(_rows(0, 4), SCHEMA)
    none = rows.where("n < 0")
    writer = FileSinkLog(spark, "json", str(out))
    writer(rows, 0, 4)
    writer(none, 1, 0)
    writer(none, 2, 0)  # waits for batch 1's entry first
    writer.flush()
    log_dir = out / SINK_LOG_DIR
    assert sorted(int(p.name) for p in log_dir.iterdir() if p.name.isdigit()) == [0, 1, 2]

    for name in ("2", ".2.crc"):  # the crash: batch 2 committed, its entry never written
        (log_dir / name).unlink(missing_ok=True)
    again = FileSinkLog(spark, "json", str(out))  # the restart: Spark goes on with batch 3
    again(spark.createDataFrame(_rows(10, 2), SCHEMA), 3, 2)
    again.flush()
    assert sorted(int(p.name) for p in log_dir.iterdir() if p.name.isdigit()) == [0, 1, 2, 3]
    want = Counter(("u%d" % (i % 3), i) for i in [*range(4), 10, 11])
    assert read_everywhere(spark, out, "json", ["user_id", "n"], SCHEMA) == {r: want for r in READERS}
