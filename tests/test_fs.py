"""sparkstate.fs on local paths and on s3a:// paths of a real S3-compatible server (S3Proxy on loopback).

The same calls on both: through the local filesystem for local paths, Spark's Hadoop S3A
filesystem (the JVM) for s3a:// with a classic session, and pyarrow.fs where there is no JVM.
"""

from __future__ import annotations

import pytest

from sparkstate import fs
from sparkstate.engines.checkpoint import has_state
from sparkstate.errors import ConfigError
from sparkstate.io.sinks import check_sink_paths, parse_sink
from tests.io.s3 import arrow_env, s3_bucket, s3_server  # noqa: F401  (fixtures)


def _exercise(root: str, spark=None) -> None:
    """Every operation of the layer under ``root`` (which does not exist yet)."""
    assert not fs.exists(root, spark) and not fs.is_dir(root, spark) and fs.list_names(root, spark) == []
    fs.write_text(fs.join(root, "a", "m.json"), '{"x": 1}\n', spark)
    fs.write_text(fs.join(root, "a", "n.txt"), "é" * 10, spark)
    assert fs.exists(fs.join(root, "a"), spark) and fs.is_dir(fs.join(root, "a"), spark)
    assert not fs.is_dir(fs.join(root, "a", "m.json"), spark)
    assert fs.list_names(fs.join(root, "a"), spark) == ["m.json", "n.txt"]
    assert fs.read_text(fs.join(root, "a", "n.txt"), spark) == "é" * 10
    fs.write_text(fs.join(root, "a", "m.json"), "{}", spark)  # replaced
    assert fs.read_text(fs.join(root, "a", "m.json"), spark) == "{}"
    assert fs.total_bytes(root, spark) == 2 + 20 and fs.total_bytes(fs.join(root, "a", "m.json"), spark) == 2
    with pytest.raises(FileNotFoundError):
        fs.read_text(fs.join(root, "a", "missing"), spark)
    fs.write_text(fs.join(root, "s", "d", "p.json"), "[]", spark)
    fs.rename(fs.join(root, "s", "d"), fs.join(root, "t", "d"), spark)  # a directory, into a new parent
    assert fs.read_text(fs.join(root, "t", "d", "p.json"), spark) == "[]"
    assert not fs.exists(fs.join(root, "s", "d"), spark)
    fs.delete(fs.join(root, "t"), spark)
    fs.delete(fs.join(root, "s"), spark)
    fs.delete(fs.join(root, "a", "m.json"), spark)
    assert fs.list_names(fs.join(root, "a"), spark) == ["n.txt"]
    fs.delete(root, spark)
    assert not fs.exists(fs.join(root, "a", "n.txt"), spark) and fs.total_bytes(root, spark) == 0
    fs.delete(root, spark)  # nothing there: nothing to do


def test_local_paths_and_file_uris_without_a_session(tmp_path):
    _exercise(str(tmp_path / "plain"))
    _exercise(f"file://{tmp_path}/uri")
    assert fs.is_local(str(tmp_path)) and fs.is_local(f"file:{tmp_path}") and not fs.is_local("s3a://b/k")
    assert fs.storage_options(str(tmp_path)) is None


def test_s3a_paths_through_spark_hadoop_filesystem(spark, s3_bucket):
    _exercise(f"s3a://{s3_bucket}/ck", spark)
    _exercise(f"s3a://{s3_bucket}/ck2")  # the active session by default


def test_s3a_paths_through_pyarrow_where_there_is_no_jvm(spark, s3_bucket):
    """pyarrow.fs with the endpoint and credentials of the session's fs.s3a.* settings: what a Spark
    Connect client uses; what it writes, Spark's S3A reads, and the other way round."""
    root = f"s3a://{s3_bucket}/arrow"
    with arrow_env():  # (S3Proxy's quirk, for pyarrow's S3 client only)
        at_root, at_file, at_dir = (fs._Arrow(spark, p) for p in (root, fs.join(root, "x", "m.json"), fs.join(root, "x")))
    assert at_root.list_names() == [] and not at_root.exists()
    at_file.write_bytes(b'{"a": 1}')
    assert fs.read_text(fs.join(root, "x", "m.json"), spark) == '{"a": 1}'  # read back through S3A
    fs.write_text(fs.join(root, "x", "n.json"), "{}", spark)
    assert at_dir.list_names() == ["m.json", "n.json"] and at_dir.is_dir() and at_file.exists()
    assert at_root.total_bytes() == 10 and at_file.read_bytes() == b'{"a": 1}'
    at_dir.rename(fs.join(root, "y"))  # a directory: moved file by file
    assert fs.list_names(fs.join(root, "y"), spark) == ["m.json", "n.json"] and not at_dir.exists()


def test_delta_storage_options_come_from_the_s3a_settings(spark, s3_bucket, s3_server):
    import deltalake
    import pyarrow as pa

    from sparkstate.io.delta import committed_version, read_delta

    path = f"s3a://{s3_bucket}/table"
    opts = fs.storage_options(path, spark)
    assert opts["AWS_ENDPOINT_URL"] == s3_server.endpoint and opts["AWS_ALLOW_HTTP"] == "true"
    deltalake.write_deltalake(path, pa.table({"n": [1, 2]}), storage_options=opts, commit_properties=deltalake.CommitProperties(
        app_transactions=[deltalake.Transaction(app_id="app", version=3)]))
    assert read_delta(path, opts).column("n").to_pylist() == [1, 2] and committed_version(path, "app", opts) == 3
    assert spark.read.parquet(path).count() == 2  # the table's files, through S3A


def test_remote_checks_are_made_not_skipped(spark, s3_bucket):
    """The checkpoint's state check and the sink checks see an s3a:// checkpoint as they see a local one."""
    ck, out = f"s3a://{s3_bucket}/ck", f"s3a://{s3_bucket}/out"
    assert not has_state(ck, spark)
    fs.write_text(fs.join(ck, "state", "0", "0", "1.delta"), "x", spark)
    fs.write_text(fs.join(ck, "commits", "0"), "v1", spark)
    assert has_state(ck, spark)
    fs.write_text(fs.join(out, "_spark_metadata", "0"), "v1", spark)
    new_ck = f"s3a://{s3_bucket}/new-ck"
    with pytest.raises(ConfigError, match="already holds output of another query"):
        check_sink_paths(parse_sink(f"parquet:{out}"), new_ck, "append", spark=spark)
    check_sink_paths(parse_sink(f"parquet:{out}"), ck, "append", spark=spark)  # its own checkpoint: fine


def test_server_files_reads_a_directory_through_the_sessions_file_source(spark, tmp_path):
    """What a Connect client gets from the server where it cannot reach a store: each file's text
    by name; names Spark's file sources skip (``_``, ``.``) are not there; a missing directory is
    empty. Run here on the classic session, whose file source is the server's."""
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n{\"logOffset\":0}")
    (tmp_path / "offsets" / "1").write_text("v1\n{}\ncaf\u00e9")
    (tmp_path / "offsets" / ".1.crc").write_bytes(b"\x00\xff")
    (tmp_path / "offsets" / "_marker.json").write_text("{}")
    assert fs.server_files(tmp_path / "offsets", spark) == {"0": "v1\n{}\n{\"logOffset\":0}",
                                                            "1": "v1\n{}\ncaf\u00e9"}
    assert fs.server_files(tmp_path / "nothing", spark) == {}


def test_server_write_text_makes_a_directory_whose_one_file_server_files_reads_back(spark, tmp_path):
    """What a Connect client writes through the server where it cannot reach a store: the text as
    the directory's one data file, replaced on a second write, readable by any reader of text."""
    fs.server_write_text(tmp_path / "marker", '{"pipeline": "sessionize"}\n', spark)
    fs.server_write_text(tmp_path / "marker", '{"pipeline": "running-count", "caf\u00e9": 1}\n', spark)
    ((name, text),) = fs.server_files(tmp_path / "marker", spark).items()
    assert name.startswith("part-") and text == '{"pipeline": "running-count", "caf\u00e9": 1}\n'
    assert (tmp_path / "marker" / name).read_text(encoding="utf-8") == text
