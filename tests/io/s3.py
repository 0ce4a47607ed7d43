"""A real S3-compatible server for the tests: S3Proxy (Maven Central) on loopback, in memory.

Started from the jars ``make s3`` fetched (``make test`` does it first), on a free port, with
``jclouds.provider=transient`` (objects in the server's memory: nothing left behind, and
S3A's directory markers stay plain objects). One server per pytest worker process
(:func:`s3_server`, session-scoped); each test takes a bucket of its own (:meth:`S3Server.bucket`).

An outage is modelled with :meth:`S3Server.pause` / :meth:`S3Server.resume` (SIGSTOP/SIGCONT):
the server keeps its objects and its port, and every request meanwhile hangs (connections are
accepted by the kernel but never answered), as an overloaded or partitioned store does.
Stopping the process would lose every object (transient storage), which no real store does.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkstate.io import connectors
from tests.ports import free_port


@dataclass
class S3Server:
    port: int
    access_key: str
    secret_key: str
    proc: subprocess.Popen
    log: Path
    buckets: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hadoop_settings(self) -> dict[str, str]:
        """The ``fs.s3a.*`` settings that reach this server (credentials included)."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": "us-east-1",
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.access.key": self.access_key,
            "fs.s3a.secret.key": self.secret_key,
            "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            # S3Proxy 2.7 answers NotImplemented to a DeleteObjects carrying the SDK's CRC32 checksum
            "fs.s3a.multiobjectdelete.enable": "false",
        }

    def spark_defaults(self, directory: Path, extra: dict[str, str] | None = None) -> Path:
        """A ``spark-defaults.conf`` in ``directory`` (use it with ``SPARK_CONF_DIR``): the S3A jars
        on the classpath and the settings as ``spark.hadoop.*``. The only place the secret is written."""
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"spark.hadoop.{k} {v}" for k, v in self.hadoop_settings().items()]
        lines += [f"{k} {v}" for k, v in (extra or {}).items()]
        (directory / "spark-defaults.conf").write_text("\n".join(lines) + "\n")
        return directory

    def arrow(self):
        """A ``pyarrow.fs.S3FileSystem`` on this server (for the tests' own looks)."""
        import pyarrow.fs as pafs

        with arrow_env():
            return pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, scheme="http",
                                 endpoint_override=f"127.0.0.1:{self.port}", region="us-east-1",
                                     allow_bucket_creation=True)

    def bucket(self) -> str:
        """A new empty bucket; its name."""
        name = f"t-{uuid.uuid4().hex[:12]}"
        self.arrow().create_dir(name)
        self.buckets.append(name)
        return name

    def pause(self) -> None:
        """The store stops answering (its objects kept): SIGSTOP."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(20)


#: pyarrow's S3 client (the AWS C++ SDK) sends checksum headers S3Proxy 2.7 answers NotImplemented
#: to, unless told to send them only when required (read once, when pyarrow first uses S3).
ARROW_ENV = {"AWS_REQUEST_CHECKSUM_CALCULATION": "when_required", "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}


@contextlib.contextmanager
def arrow_env():
    """:data:`ARROW_ENV` set while pyarrow makes an S3 client, and only then: the AWS Java SDK in
    S3A reads the same variables, and S3Proxy refuses its DeleteObjects under them."""
    before = {k: os.environ.get(k) for k in ARROW_ENV}
    os.environ.update(ARROW_ENV)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_s3_server(workdir: Path, timeout_s: float = 120.0) -> S3Server:
    """S3Proxy on a free loopback port; returns once it answers."""
    try:
        classpath = connectors.jars("s3proxy")
    except Exception as exc:
        pytest.fail(f"S3Proxy is not fetched: {exc}")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    access, secret = "test-" + secrets.token_hex(4), "secret-" + secrets.token_hex(16)
    props = workdir / "s3proxy.properties"
    props.write_text("\n".join([
        f"s3proxy.endpoint=http://127.0.0.1:{port}",
        "s3proxy.authorization=aws-v2-or-v4",
        f"s3proxy.identity={access}",
        f"s3proxy.credential={secret}",
        "jclouds.provider=transient",
        "jclouds.identity=local",
        "jclouds.credential=local",
    ]) + "\n")
    log = workdir / "s3proxy.log"
    env = dict(os.environ, LOG_LEVEL="warn")
    with open(log, "ab") as out:
        proc = subprocess.Popen(["java", "-Xmx256m", "-cp", os.pathsep.join(classpath), "org.gaul.s3proxy.Main",
                                 "--properties", str(props)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    server = S3Server(port, access, secret, proc, log)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"S3Proxy exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            server.arrow().get_file_info("probe-bucket")  # an answer of any kind: it serves
            return server
        except OSError as exc:
            if "onnect" not in str(exc) and "refused" not in str(exc):
                return server
        if time.monotonic() > deadline:
            server.stop()
            raise AssertionError(f"S3Proxy did not answer in {timeout_s} s: {log.read_text()[-2000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One S3Proxy per pytest worker, stopped at the end."""
    server = start_s3_server(tmp_path_factory.mktemp("s3proxy"))
    try:
        yield server
    finally:
        server.stop()


def use_s3(spark, server: S3Server) -> None:
    """Point the (test) session's Hadoop configuration at ``server``: its s3a:// paths reach it."""
    conf = spark._jsc.hadoopConfiguration()
    for k, v in server.hadoop_settings().items():
        conf.set(k, v)


@pytest.fixture
def s3_bucket(spark, s3_server) -> str:
    """A new bucket on the worker's S3Proxy, with the test session's s3a settings pointing at it."""
    if not connectors.fetched("hadoop-aws"):
        pytest.fail("the S3A jars are not fetched: run `make s3`")
    use_s3(spark, s3_server)
    return s3_server.bucket()
