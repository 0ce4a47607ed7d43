"""``sparkstate generate`` as library calls: the generator's records into files, or onto a socket.

>>> import tempfile
>>> from sparkstate.synthetic import StreamConfig
>>> written = generate_files(tempfile.mkdtemp(), StreamConfig(users=2, events=20, rate=0, malformed_share=0.2), files=2)
>>> len(written.paths), written.records, written.records == sum(written.kinds.values())
(2, 20, True)
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..synthetic.generator import write_lines_in_order
from ..synthetic.stream import StreamConfig, serve_events, stream_records
from ..synthetic.line_server import LineServer


@dataclass(frozen=True)
class GeneratedFiles:
    """What :func:`generate_files` wrote: the files in order, and how many records of each kind."""

    directory: str
    paths: list[str]
    records: int
    kinds: dict[str, int] = field(default_factory=dict)


def generate_files(directory: str | os.PathLike, config: StreamConfig, files: int = 10) -> GeneratedFiles:
    """Write the generator's records ``0 .. config.events`` as JSON lines into ``files`` files.

    The records are :func:`~sparkstate.synthetic.stream.stream_records` (``late`` and malformed ones
    included, as ``config`` asks). The files are consecutive, nearly equal parts in record
    order (``part-00000.json``, ...), each written under a hidden name and renamed, with
    modification times one second apart, so a file stream reads them in order. Existing files
    are never overwritten.
    """
    if config.events is None:
        raise ConfigError("generate: writing files needs a number of events (--events N)")
    records = stream_records(config)
    names = write_lines_in_order([r.line for r in records], directory, files, "generate")
    kinds: dict[str, int] = dict(sorted(Counter(r.kind for r in records).items()))
    return GeneratedFiles(str(Path(directory)), [str(p) for p in names], len(records), kinds)


def serve_generated(config: StreamConfig, port: int, host: str = "127.0.0.1") -> LineServer:
    """Serve the generator's records as JSON lines on ``host:port`` (every client gets the stream from
    its start, paced at ``config.rate`` records per second); close the returned server to stop.

    >>> import socket
    >>> with serve_generated(StreamConfig(users=1, events=3, rate=0), port=0) as server:
    ...     with socket.create_connection((server.host, server.port), timeout=5) as conn:
    ...         f = conn.makefile()
    ...         [f.readline().startswith("{") for _ in range(3)]
    [True, True, True]
    """
    return serve_events(config, host, port)


__all__ = ["GeneratedFiles", "generate_files", "serve_generated"]
