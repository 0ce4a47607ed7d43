"""A small TCP server that sends text lines to every client: what Spark's socket source reads.

Each client that connects gets every line from the first one (so the query reading the good
records and the one reading the dead letters of a socket source both see the whole input),
optionally paced at ``rate`` lines per second. The server binds to localhost unless told
otherwise; ``port=0`` picks a free port (read it from :attr:`LineServer.port`).

>>> import socket
>>> with serve_lines(['{"a": 1}', '{"a": 2}'], hold=False) as server:
...     with socket.create_connection((server.host, server.port), timeout=5) as conn:
...         conn.makefile().read().splitlines()
['{"a": 1}', '{"a": 2}']
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable, Iterable

from ..errors import ConfigError

log = logging.getLogger("sparkstate.synthetic")

Lines = Iterable[str | bytes] | Callable[[], Iterable[str | bytes]]


class LineServer:
    """A TCP server on ``host:port`` sending ``lines`` (one ``\\n``-terminated line each) to every client.

    ``lines`` is a sequence (sent whole to each client) or a callable returning a fresh iterable
    per client (for endless streams); a ``str`` line is sent as UTF-8, a ``bytes`` line as it is
    (to serve bytes that are not valid UTF-8). ``rate``: lines per second per client (``None``: as fast
    as the client reads). ``hold=True`` keeps a connection open after the last line until the
    server closes, as a live source would; ``hold=False`` closes it (the client sees the end).
    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        lines: Lines,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        rate: float | None = None,
        hold: bool = True,
    ) -> None:
        if rate is not None and not rate > 0:
            raise ConfigError(f"serve_lines: rate is lines per second and must be > 0 (or None), got {rate!r}")
        if callable(lines):
            self._factory: Callable[[], Iterable[str | bytes]] = lines
        else:
            fixed = list(lines)
            self._factory = lambda: fixed
        self.rate = rate
        self.hold = hold
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._clients: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.connections = 0
        self.lines_sent = 0
        try:
            self._listener = socket.create_server((host, port))
        except OSError as exc:
            raise ConfigError(f"serve_lines: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self._listener.settimeout(0.2)
        self.host, self.port = self._listener.getsockname()[:2]
        self._acceptor = threading.Thread(target=self._accept, name=f"sparkstate-lines-{self.port}", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        """``HOST:PORT``, as ``socket:HOST:PORT`` source specs take it."""
        return f"{self.host}:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._clients.append(conn)
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        started = time.monotonic()
        try:
            for i, line in enumerate(self._factory()):
                if self._stop.is_set():
                    return
                if self.rate is not None:
                    delay = started + i / self.rate - time.monotonic()
                    if delay > 0 and self._stop.wait(delay):
                        return
                if isinstance(line, (bytes, bytearray)):  # sent as they are, invalid UTF-8 included
                    conn.sendall(bytes(line).rstrip(b"\n") + b"\n")
                else:
                    conn.sendall((line.rstrip("\n") + "\n").encode("utf-8"))
                with self._lock:
                    self.lines_sent += 1
            if self.hold:
                self._stop.wait()
        except OSError as exc:  # the client went away
            log.debug("line server %s: client closed: %s", self.address, exc)
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        """Stop accepting, close every connection and wait for the sending threads."""
        self._stop.set()
        self._listener.close()
        self._acceptor.join(timeout=5)
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=5)

    def __enter__(self) -> "LineServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LineServer({self.address}, connections={self.connections}, lines_sent={self.lines_sent})"


def serve_lines(
    lines: Lines, host: str = "127.0.0.1", port: int = 0, *, rate: float | None = None, hold: bool = True
) -> LineServer:
    """Start a :class:`LineServer` (already listening when this returns).

    >>> with serve_lines(["x"]) as server:
    ...     server.port > 0
    True
    """
    return LineServer(lines, host, port, rate=rate, hold=hold)


__all__ = ["LineServer", "serve_lines"]
