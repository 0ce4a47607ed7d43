"""A job's run over Spark Connect outlives its client: taking over a run whose client is gone.

Over Spark Connect a streaming query runs in the server, in the client's server-side session.
A client killed with ``kill -9``, a crashed notebook kernel or a lost laptop leaves its query
running there until the session expires (an hour by default). Starting the job again works
(Spark stops the old run when a query on the same checkpoint starts), but only after the new
query's start: the old run keeps the server busy while the new run's Python process must
connect back to Spark within its fixed 10 s, and two runs write for a while.

So a job over Connect leaves a note on this machine while it runs: the server, the checkpoint,
its server-side session and its process (:func:`claim`). The next run on that checkpoint reads
it first:

- the process is gone: the run it left is stopped (after its running batch commits) through its
  session, which is then released, and the new run starts on the checkpoint;
- the process still runs the job: the new run is refused with one line, before anything is
  written (two clients of one checkpoint would stop each other);
- nothing of it is left on the server: the new run starts as usual.

A run that ends, fails or is interrupted removes its note (:func:`release`). A restart from
another machine does not see the note: Spark's own replacement still applies there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import JobFailedError
from ..paths import cache_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkstate.jobs")

#: The setting of a Connect URL that names the server-side session.
SESSION_PARAM = "session_id"


@dataclass(frozen=True)
class Claim:
    """This run's note (:func:`claim`)."""

    path: Path
    session_id: str


def server_url(spark: "SparkSession") -> str | None:
    """The ``sc://`` URL a Connect session was made with, or ``None`` (a classic session, or a
    client whose URL cannot be read)."""
    builder = getattr(getattr(spark, "client", None), "_builder", None)
    parsed = getattr(builder, "url", None)  # pyspark's DefaultChannelBuilder: the URL, parsed as http
    if parsed is None:
        return None
    return "sc" + parsed.geturl()[len("http"):]


def with_session(url: str, session_id: str) -> str:
    """``url`` with its server-side session set to ``session_id``.

    >>> with_session("sc://h:15002", "abc")
    'sc://h:15002/;session_id=abc'
    >>> with_session("sc://h:15002/;token=t;session_id=old", "abc")
    'sc://h:15002/;token=t;session_id=abc'
    """
    head, _, params = url.partition("/;")
    kept = [p for p in params.split(";") if p and not p.startswith(SESSION_PARAM + "=")]
    return f"{head.rstrip('/')}/;" + ";".join([*kept, f"{SESSION_PARAM}={session_id}"])


def _server(url: str) -> str:
    """The server's part of a URL (no settings: a token or a session does not make another server)."""
    return url.partition("/;")[0].rstrip("/")


def note_path(url: str, checkpoint: str) -> Path:
    digest = hashlib.sha256(f"{_server(url)}\n{checkpoint}".encode()).hexdigest()[:20]
    return cache_dir() / "connect-runs" / f"{digest}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: Path) -> dict[str, Any] | None:
    try:
        note = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) and {"session_id", "pid"} <= note.keys() else None


def claim(spark: "SparkSession", checkpoint: str, query_name: str, what: str) -> Claim | None:
    """Before a job's query starts over Connect: deal with a run an earlier client of this
    machine left on ``checkpoint`` (see the module), then leave this run's note.

    Raises :class:`~sparkstate.errors.JobFailedError` when a live process of this machine runs
    the job on that checkpoint. Returns ``None`` when the session's URL cannot be read: then
    nothing is checked and Spark's own replacement of the older run applies.
    """
    url = server_url(spark)
    if url is None:
        return None
    path = note_path(url, checkpoint)
    note = _read(path)
    session_id: str = spark.session_id  # type: ignore[attr-defined]  # a Spark Connect session's
    if note is not None and note["session_id"] != session_id:
        _take_over(url, note, checkpoint, query_name, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"session_id": session_id, "pid": os.getpid(), "query": query_name,
                               "checkpoint": checkpoint, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
    tmp.replace(path)
    return Claim(path, session_id)


def _take_over(url: str, note: dict[str, Any], checkpoint: str, query_name: str, what: str) -> None:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from .control import stop_after_current_batch

    pid = int(note["pid"])
    live_client = pid != os.getpid() and _alive(pid)
    try:
        other = ConnectSession.builder.remote(with_session(url, str(note["session_id"]))).create()
    except Exception as exc:  # an id this client cannot use: nothing to take over from here
        log.info("%s: the session of the run before (%s) cannot be reached: %s", what, note["session_id"], exc)
        return
    # A session of a process still running (or of this one) is not this run's to end.
    other.release_session_on_close = not (live_client or pid == os.getpid())
    try:
        try:
            running = [q for q in other.streams.active if q.name == query_name]
        except Exception as exc:  # the session was released or expired: nothing runs in it
            log.info("%s: no run left in session %s: %s", what, note["session_id"], str(exc).splitlines()[0][:200])
            return
        if running and live_client:
            raise JobFailedError(
                f"{what}: the checkpoint {checkpoint} is in use: process {pid} on this machine runs this job on"
                f" the Spark Connect server (since {note.get('started', '?')}). Nothing was started: stop that run"
                " first (Ctrl-C), or give this one another --checkpoint.")
        for query in running:
            log.warning("%s: a run of this job whose client is gone (process %d) was still running on the Spark"
                        " Connect server; stopping it after its running batch before this run starts (committed"
                        " batches stay, the rest is redone)", what, pid)
            stop_after_current_batch(query)  # type: ignore[arg-type]  # Connect's query has the same methods
    finally:
        try:
            other.stop()
        except Exception as exc:  # cleanup only: the server ends an unused session by itself
            log.info("%s: releasing session %s: %s", what, note["session_id"], exc)


def release(run: Claim | None) -> None:
    """Remove this run's note (unless a later run has replaced it)."""
    if run is None:
        return
    note = _read(run.path)
    if note is not None and note["session_id"] == run.session_id and note["pid"] == os.getpid():
        run.path.unlink(missing_ok=True)


__all__ = ["Claim", "claim", "note_path", "release", "server_url", "with_session"]
