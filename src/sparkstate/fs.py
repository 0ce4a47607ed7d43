"""The paths users give (checkpoints, outputs, inputs, initial state), on any filesystem Spark reaches.

A handful of operations (:func:`exists`, :func:`is_dir`, :func:`list_names`, :func:`read_text`,
:func:`write_text`, :func:`delete`, :func:`total_bytes`) that sparkstate's own checks and tools
need on a user's path, whatever its scheme:

- a local path (no scheme, ``file:``): the local filesystem, directly (fast; no JVM);
- any other URI (``s3a://``, ``hdfs://``, ``abfss://``, ``gs://`` ...) with a classic Spark
  session: Spark's own Hadoop ``FileSystem`` through the JVM, with the session's Hadoop
  configuration (``spark.hadoop.*``: the same jars, endpoint and credentials Spark uses);
- without a JVM (Spark Connect, or no session): ``pyarrow.fs``, configured for ``s3a://``
  from the session's ``spark.hadoop.fs.s3a.*`` settings when it can read them.

Over Spark Connect, :func:`server_files` reads the files of a directory through the server's
own file source, which reaches whatever the server's Hadoop configuration reaches: the way to a
store this process cannot reach, for the small logs a checkpoint keeps.

A remote path is never skipped silently: when no way to reach it exists, :class:`FsUnavailable`
says so, and callers that only check (the Connect client) log that the check was not made.

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> write_text(join(d, "a", "b.txt"), "hi")
>>> exists(join(d, "a")), is_dir(join(d, "a")), list_names(join(d, "a")), read_text(join(d, "a", "b.txt"))
(True, True, ['b.txt'], 'hi')
>>> is_local(d), is_local("file:" + d), is_local("s3a://bucket/ck")
(True, True, False)
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .errors import ConfigError
from .paths import local_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkstate.fs")


class FsUnavailable(ConfigError):
    """No way to reach a (remote) path from this process."""


def is_local(path: str | os.PathLike) -> bool:
    """Whether ``path`` is on the local filesystem (no scheme, ``file:``)."""
    return local_path(os.fspath(path)) is not None


def join(path: str | os.PathLike, *parts: str) -> str:
    """``path`` with ``parts`` appended, ``/``-separated (URIs kept as they are).

    >>> join("s3a://b/ck/", "commits", "0"), join("/tmp/ck", "state")
    ('s3a://b/ck/commits/0', '/tmp/ck/state')
    """
    out = os.fspath(path)
    for p in parts:
        out = out.rstrip("/") + "/" + p.strip("/")
    return out


def _session(spark: "SparkSession | None") -> "SparkSession | None":
    if spark is not None:
        return spark
    try:
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession()
    except Exception:
        return None


def _jvm_of(spark: "SparkSession | None") -> Any:
    from .spark import is_connect

    if spark is None or is_connect(spark):
        return None
    return getattr(spark, "_jvm", None)


# --- the backends ------------------------------------------------------------------------------

class _Local:
    def __init__(self, path: Path) -> None:
        self.p = path

    def exists(self) -> bool:
        return self.p.exists()

    def is_dir(self) -> bool:
        return self.p.is_dir()

    def list_names(self) -> list[str]:
        return sorted(os.listdir(self.p)) if self.p.is_dir() else []

    def read_bytes(self) -> bytes:
        return self.p.read_bytes()

    def write_bytes(self, data: bytes) -> None:
        self.p.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.p.with_name(f".{self.p.name}.tmp")
        try:
            tmp.write_bytes(data)
            tmp.replace(self.p)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def delete(self) -> None:
        if self.p.is_dir():
            shutil.rmtree(self.p)
        elif self.p.exists() or self.p.is_symlink():
            self.p.unlink()

    def rename(self, dst: str) -> None:
        target = Path(local_path(dst) or dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.p, target)

    def total_bytes(self) -> int:
        if self.p.is_file():
            return self.p.stat().st_size
        return sum(f.stat().st_size for f in self.p.rglob("*") if f.is_file()) if self.p.is_dir() else 0


class _Hadoop:
    """Spark's Hadoop FileSystem for the path, with the session's Hadoop configuration."""

    def __init__(self, spark: "SparkSession", path: str) -> None:
        jvm: Any = spark._jvm  # a classic session's gateway (never None there)
        conf = spark._jsparkSession.sessionState().newHadoopConf()  # type: ignore[attr-defined]
        self.jvm = jvm
        self.path = path
        self.p = jvm.org.apache.hadoop.fs.Path(path)
        try:
            self.fs = self.p.getFileSystem(conf)
        except Exception as exc:
            raise FsUnavailable(f"{path}: Spark has no filesystem for it ({_java_message(exc)})") from None

    def exists(self) -> bool:
        return bool(self.fs.exists(self.p))

    def is_dir(self) -> bool:
        try:
            return bool(self.fs.getFileStatus(self.p).isDirectory())
        except Exception as exc:
            if "FileNotFoundException" in str(exc):
                return False
            raise

    def list_names(self) -> list[str]:
        try:
            statuses = self.fs.listStatus(self.p)
        except Exception as exc:
            if "FileNotFoundException" in str(exc):
                return []
            raise
        return sorted(s.getPath().getName() for s in statuses)

    def read_bytes(self) -> bytes:
        stream = self.fs.open(self.p)
        try:
            return bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def write_bytes(self, data: bytes) -> None:
        out = self.fs.create(self.p, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def delete(self) -> None:
        self.fs.delete(self.p, True)

    def rename(self, dst: str) -> None:
        target = self.jvm.org.apache.hadoop.fs.Path(dst)
        self.fs.mkdirs(target.getParent())
        if not self.fs.rename(self.p, target):
            raise OSError(f"{self.path}: could not rename it to {dst}")

    def total_bytes(self) -> int:
        if not self.fs.exists(self.p):
            return 0
        return int(self.fs.getContentSummary(self.p).getLength())


_S3_SCHEMES = ("s3a", "s3", "s3n")


def s3_settings(path: str, spark: "SparkSession | None" = None) -> dict[str, str]:
    """The ``fs.s3a.*`` Hadoop settings that apply to ``path``'s bucket (per-bucket ones first).

    Read from the session's Hadoop configuration (classic) or its ``spark.hadoop.*`` settings
    (Spark Connect); empty without a session.
    """
    spark = _session(spark)
    if spark is None:
        return {}
    bucket = urlsplit(path).netloc
    keys = ("endpoint", "endpoint.region", "path.style.access", "connection.ssl.enabled", "access.key", "secret.key",
            "session.token")
    jvm = _jvm_of(spark)
    out: dict[str, str] = {}
    if jvm is not None:
        conf = spark._jsparkSession.sessionState().newHadoopConf()  # type: ignore[attr-defined]

        def get(k: str) -> str | None:
            v = conf.getPassword(k)  # credential providers too, as S3A reads them
            return None if v is None else "".join(v)
    else:
        def get(k: str) -> str | None:
            try:
                return spark.conf.get(f"spark.hadoop.{k}", None)  # type: ignore[union-attr]
            except Exception:
                return None
    for k in keys:
        v = get(f"fs.s3a.bucket.{bucket}.{k}") or get(f"fs.s3a.{k}")
        if v:
            out[k] = v
    return out


def storage_options(path: str, spark: "SparkSession | None" = None) -> dict[str, str] | None:
    """Options for delta-rs (``deltalake``) to reach ``path`` as Spark's S3A does; ``None`` for other paths.

    >>> storage_options("/tmp/t") is None
    True
    """
    if urlsplit(path).scheme not in _S3_SCHEMES:
        return None
    s = s3_settings(path, spark)
    out: dict[str, str] = {}
    if "endpoint" in s:
        endpoint = s["endpoint"]
        if "://" not in endpoint:
            ssl = s.get("connection.ssl.enabled", "true").lower() != "false"
            endpoint = ("https://" if ssl else "http://") + endpoint
        out["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    if "endpoint.region" in s:
        out["AWS_REGION"] = s["endpoint.region"]
    if s.get("path.style.access", "").lower() == "true":
        out["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    for k, name in (("access.key", "AWS_ACCESS_KEY_ID"), ("secret.key", "AWS_SECRET_ACCESS_KEY"),
                    ("session.token", "AWS_SESSION_TOKEN")):
        if k in s:
            out[name] = s[k]
    return out


class _Arrow:
    """``pyarrow.fs`` for the path (no JVM in this process)."""

    def __init__(self, spark: "SparkSession | None", path: str) -> None:
        import pyarrow.fs as pafs

        self.path = path
        parts = urlsplit(path)
        try:
            if parts.scheme in _S3_SCHEMES:
                s = s3_settings(path, spark)
                kwargs: dict[str, Any] = {}
                if "endpoint" in s:
                    endpoint = s["endpoint"]
                    scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("", "", endpoint)
                    kwargs["endpoint_override"] = host
                    if scheme == "http" or s.get("connection.ssl.enabled", "").lower() == "false":
                        kwargs["scheme"] = "http"
                if "endpoint.region" in s:
                    kwargs["region"] = s["endpoint.region"]
                if "access.key" in s and "secret.key" in s:
                    kwargs.update(access_key=s["access.key"], secret_key=s["secret.key"],
                                  session_token=s.get("session.token"))
                self.fs = pafs.S3FileSystem(**kwargs)
                self.p = (parts.netloc + parts.path).rstrip("/")
            else:
                self.fs, self.p = pafs.FileSystem.from_uri(path)
                self.p = self.p.rstrip("/")
        except Exception as exc:
            raise FsUnavailable(f"{path}: cannot reach it from this process without Spark's JVM"
                                f" ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None

    def _info(self) -> Any:
        return self.fs.get_file_info(self.p)

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self._info().type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        import pyarrow.fs as pafs

        return self._info().type == pafs.FileType.Directory

    def list_names(self) -> list[str]:
        import pyarrow.fs as pafs

        if not self.is_dir():
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.p, allow_not_found=True))
        return sorted(i.base_name for i in infos)

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.p) as f:
            return f.read()

    def write_bytes(self, data: bytes) -> None:
        with self.fs.open_output_stream(self.p) as f:
            f.write(data)

    def delete(self) -> None:
        import pyarrow.fs as pafs

        kind = self._info().type
        if kind == pafs.FileType.Directory:
            self.fs.delete_dir(self.p)
        elif kind != pafs.FileType.NotFound:
            self.fs.delete_file(self.p)

    def rename(self, dst: str) -> None:
        import pyarrow.fs as pafs

        parts = urlsplit(dst)
        target = (parts.netloc + parts.path if parts.scheme in _S3_SCHEMES
                  else pafs.FileSystem.from_uri(dst)[1]).rstrip("/")
        if self._info().type != pafs.FileType.Directory:
            self.fs.move(self.p, target)
            return
        # Object stores move files, not directories: one file after another, then the directory.
        for info in self.fs.get_file_info(pafs.FileSelector(self.p, recursive=True)):
            if info.type == pafs.FileType.File:
                self.fs.move(info.path, target + info.path[len(self.p):])
        self.fs.delete_dir(self.p)

    def total_bytes(self) -> int:
        import pyarrow.fs as pafs

        info = self._info()
        if info.type == pafs.FileType.File:
            return int(info.size or 0)
        if info.type != pafs.FileType.Directory:
            return 0
        infos = self.fs.get_file_info(pafs.FileSelector(self.p, recursive=True))
        return sum(int(i.size or 0) for i in infos if i.type == pafs.FileType.File)


def _java_message(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "Exception:" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _backend(path: str | os.PathLike, spark: "SparkSession | None") -> Any:
    path = os.fspath(path)
    local = local_path(path)
    if local is not None:
        return _Local(local)
    spark = _session(spark)
    if _jvm_of(spark) is not None:
        return _Hadoop(spark, path)  # type: ignore[arg-type]
    return _Arrow(spark, path)


def _call(path: str | os.PathLike, spark: "SparkSession | None", op: str, *args: Any) -> Any:
    backend = _backend(path, spark)
    try:
        return getattr(backend, op)(*args)
    except (OSError, FsUnavailable):
        raise
    except Exception as exc:  # a Java exception through py4j, or pyarrow's
        message = _java_message(exc)
        if "FileNotFoundException" in message:
            raise FileNotFoundError(f"{os.fspath(path)}: {message}") from None
        raise OSError(f"{os.fspath(path)}: {message}") from None


def exists(path: str | os.PathLike, spark: "SparkSession | None" = None) -> bool:
    """Whether ``path`` (a file or a directory) exists."""
    return bool(_call(path, spark, "exists"))


def is_dir(path: str | os.PathLike, spark: "SparkSession | None" = None) -> bool:
    """Whether ``path`` is a directory (on object stores: has entries below it)."""
    return bool(_call(path, spark, "is_dir"))


def list_names(path: str | os.PathLike, spark: "SparkSession | None" = None) -> list[str]:
    """The names directly in directory ``path``, sorted (``[]`` when it does not exist)."""
    return list(_call(path, spark, "list_names"))


def read_text(path: str | os.PathLike, spark: "SparkSession | None" = None) -> str:
    """The content of the small file ``path`` (UTF-8); :class:`FileNotFoundError` when missing."""
    if not exists(path, spark):
        raise FileNotFoundError(f"{os.fspath(path)} does not exist")
    return bytes(_call(path, spark, "read_bytes")).decode("utf-8")


def write_text(path: str | os.PathLike, text: str, spark: "SparkSession | None" = None) -> None:
    """Write the small file ``path`` (replaced if present, parent directories made); whole or not at all
    on a local disk (a temporary file renamed) and on object stores (one upload)."""
    _call(path, spark, "write_bytes", text.encode("utf-8"))


def delete(path: str | os.PathLike, spark: "SparkSession | None" = None) -> None:
    """Delete the file or directory tree ``path`` (nothing when it does not exist)."""
    _call(path, spark, "delete")


def rename(path: str | os.PathLike, dst: str | os.PathLike, spark: "SparkSession | None" = None) -> None:
    """Move the file or directory ``path`` to ``dst`` on the same filesystem (parent directories made).
    One atomic step on a local disk and HDFS; on object stores each file is copied and deleted."""
    _call(path, spark, "rename", os.fspath(dst))


def total_bytes(path: str | os.PathLike, spark: "SparkSession | None" = None) -> int:
    """The bytes of the files under ``path`` (0 when it does not exist)."""
    return int(_call(path, spark, "total_bytes"))


def is_path_not_found(exc: BaseException) -> bool:
    """Whether ``exc``, raised by Spark resolving a file source, says its path does not exist."""
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)  # 4.0+ / 3.5
    try:
        name = condition() if callable(condition) else None
    except Exception:
        name = None
    return name == "PATH_NOT_FOUND" or "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc)


def server_files(directory: str | os.PathLike, spark: "SparkSession") -> dict[str, str]:
    """The files directly in ``directory``, name -> text (UTF-8), read by the session's own file
    source (``binaryFile``): over Spark Connect the server reads them, so this reaches whatever the
    server reaches (``dbfs:/``, ``abfss://``, ``hdfs://``, a ``viewfs://`` mount) where this process
    reaches nothing (:class:`FsUnavailable`). For small files (a checkpoint's logs): each is read
    whole. Spark's file sources never see names that begin with ``_`` or ``.``; ``{}`` when
    ``directory`` does not exist."""
    try:
        rows = spark.read.format("binaryFile").load(os.fspath(directory)).select("path", "content").collect()
    except Exception as exc:
        if is_path_not_found(exc):
            return {}
        raise
    return {str(r["path"]).rstrip("/").rsplit("/", 1)[-1]: bytes(r["content"]).decode("utf-8") for r in rows}


def server_write_text(directory: str | os.PathLike, text: str, spark: "SparkSession") -> None:
    """Make ``directory`` hold ``text`` (UTF-8, ending in a newline) as its one data file, written
    by the session's own file writer (``text``, replacing what the directory held): over Spark
    Connect the server writes it, where this process reaches nothing (:class:`FsUnavailable`).
    The file's name is the writer's (``part-...``); :func:`server_files` reads it back."""
    line = text[:-1] if text.endswith("\n") else text
    spark.createDataFrame([(line,)], "value string").coalesce(1).write.mode("overwrite").text(os.fspath(directory))


__all__ = ["FsUnavailable", "delete", "exists", "is_dir", "is_local", "is_path_not_found", "join", "list_names",
           "read_text", "rename", "s3_settings", "server_files", "server_write_text", "storage_options", "total_bytes",
           "write_text"]
