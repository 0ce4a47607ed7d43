"""A throwaway PostgreSQL server for the tests: initdb into a temp dir, start on a free port.

The server binaries come from the OS (Debian: ``apt-get install -y postgresql``, which
``make test`` does when they are missing). Without them the fixture fails, it does not skip:
the PostgreSQL sink is tested against the real thing or not at all.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` OS user
(created by the Debian package) through ``runuser``; the data directory is owned by it.
Password authentication (scram-sha-256) is on for TCP connections, so tests can check that
credentials are used and never shown.

Import the fixture where it is needed: ``from tests.io.pg import postgres_server  # noqa: F401``.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import pytest

from tests.ports import free_port

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them: on Debian/Ubuntu"
    " `sudo apt-get install -y postgresql` (or run `make pg`, which `make test` does first); elsewhere"
    " put a PostgreSQL bin directory on PATH or set SPARKSTATE_PG_BIN=/path/to/postgresql/bin."
)


def find_pg_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: $SPARKSTATE_PG_BIN, Debian's newest, or PATH."""
    candidates: list[str] = []
    if os.environ.get("SPARKSTATE_PG_BIN"):
        candidates.append(os.environ["SPARKSTATE_PG_BIN"])

    def version(p: str) -> float:
        try:
            return float(Path(p).parent.parent.name)
        except ValueError:
            return 0.0

    candidates += [str(Path(p).parent) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True)]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for c in candidates:
        d = Path(c)
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    return None


@dataclass
class PgServer:
    """A running server: a database ``dbname`` owned by ``user`` (password auth over TCP)."""

    host: str
    port: int
    dbname: str
    user: str
    password: str = field(repr=False)
    datadir: Path
    _run_as: list[str] = field(repr=False)
    _bin: Path = field(repr=False)
    _opts: str = field(default="", repr=False)

    @property
    def url(self) -> str:
        """``postgresql://user:password@host:port/db`` (password included)."""
        return f"postgresql://{self.user}:{quote(self.password, safe='')}@{self.host}:{self.port}/{self.dbname}"

    @property
    def url_without_password(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    def connect(self):
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self.connect() as conn:
            return conn.execute(sql, params).fetchall()

    def execute(self, sql: str, params: tuple = ()) -> None:
        with self.connect() as conn:
            conn.execute(sql, params)

    def stop(self) -> None:
        subprocess.run(self._run_as + [str(self._bin / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=60)

    def remove(self) -> None:
        """Stop the server and delete its directory (data, log, socket)."""
        self.stop()
        shutil.rmtree(self.datadir.parent, ignore_errors=True)

    def crash(self) -> None:
        """Stop the server the hard way (``-m immediate``: no shutdown checkpoint; transactions in flight
        are lost and the next start runs crash recovery), as a killed server would."""
        res = subprocess.run(self._run_as + [str(self._bin / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                                             "-w", "stop"], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise RuntimeError(f"pg_ctl stop -m immediate failed: {res.stdout}{res.stderr}")

    def start(self) -> None:
        """Start the server again (same port and data) after :meth:`stop` or :meth:`crash`; return once it
        accepts connections."""
        res = subprocess.run(self._run_as + [str(self._bin / "pg_ctl"), "-D", str(self.datadir), "-l",
                                             str(self.datadir.parent / "server.log"), "-o", self._opts, "-w", "-t",
                                             "120", "start"], capture_output=True, text=True, timeout=180)
        if res.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {res.stdout}{res.stderr}")


def start_server() -> PgServer:
    """initdb + pg_ctl start on a free 127.0.0.1 port; create a login role and its database."""
    pg_bin = find_pg_bin()
    if pg_bin is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    run_as: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root, PostgreSQL needs an unprivileged OS user to run as, and there is no"
                        " `postgres` user (the Debian package creates it: `apt-get install -y postgresql`).",
                        pytrace=False)
        run_as = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="sparkstate-pg-"))
    datadir = root / "data"
    superpw = secrets.token_urlsafe(16)
    pwfile = root / "pw"
    pwfile.write_text(superpw + "\n")
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
        os.chown(pwfile, owner.pw_uid, owner.pw_gid)
    pwfile.chmod(0o600)

    def run(args: list[str], what: str) -> None:
        res = subprocess.run(run_as + args, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            pytest.fail(f"PostgreSQL test server: {what} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}",
                        pytrace=False)

    run([str(pg_bin / "initdb"), "-D", str(datadir), "-U", "postgres", f"--pwfile={pwfile}", "-A", "scram-sha-256",
         "--no-sync", "-E", "UTF8", "--locale=C"], "initdb")
    port = free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='{root}'"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=30")
    run([str(pg_bin / "pg_ctl"), "-D", str(datadir), "-l", str(root / "server.log"), "-o", opts, "-w", "-t", "60",
         "start"], "pg_ctl start")
    import psycopg

    user, password, dbname = "sparkstate", "p@ss:w/rd-" + secrets.token_hex(8), "sparkstate_test"
    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", password=superpw, dbname="postgres",
                         autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        conn.execute(f"CREATE DATABASE {dbname} OWNER {user}")
    return PgServer("127.0.0.1", port, dbname, user, password, datadir, run_as, pg_bin, opts)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    """A real PostgreSQL server for the session; stopped and deleted at the end."""
    server = start_server()
    try:
        yield server
    finally:
        server.remove()
