"""Paths a user gives (checkpoints, sinks, sources): local ones told apart from URIs; and where
sparkstate keeps its own files (:func:`cache_dir`).

A relative local path is made absolute before it reaches Spark: a Spark Connect server (and an
executor) resolves relative paths against a working directory of its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit


def local_path(path: str) -> Path | None:
    """A local filesystem path for ``path``, or ``None`` for a remote URI (hdfs://, s3a://...).

    >>> local_path("file:///tmp/ck"), local_path("s3a://bucket/ck")
    (PosixPath('/tmp/ck'), None)
    """
    scheme = urlsplit(path).scheme
    if scheme in ("", "file") or len(scheme) == 1:  # len 1: a Windows drive letter
        return Path(path[len("file://"):] if path.startswith("file://") else path.removeprefix("file:"))
    return None


def absolute_path(path: str | os.PathLike) -> str:
    """``path`` with a relative local path made absolute (from this process's directory); URIs unchanged.

    >>> absolute_path("s3a://bucket/ck"), absolute_path("/tmp/ck")
    ('s3a://bucket/ck', '/tmp/ck')
    >>> absolute_path("ck") == os.path.join(os.getcwd(), "ck")
    True
    """
    path = os.fspath(path)
    if "://" in path or path.startswith("file:") or os.path.isabs(path):
        return path
    return str(Path(path).expanduser().absolute())


__all__ = ["absolute_path", "local_path"]


def cache_dir() -> Path:
    """Where sparkstate keeps what it fetches and makes (connector classpaths, the JVM archive, Connect
    run notes): ``$SPARKSTATE_CACHE``, else ``~/.cache/sparkstate``."""
    env = os.environ.get("SPARKSTATE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sparkstate"
