"""A real Spark Connect server for the tests: the pyspark wheel's own SparkConnectServer, on a
free loopback port, its Python workers on this interpreter, Spark's Kafka connector on its
classpath (the jars `make kafka` fetched), stopped at the end."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port
from tests.refusing_python import RefusingPython

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: The server's Hadoop mounts ``viewfs://sparkstate/`` on its local root (:func:`server_only`).
VIEWFS_MOUNT = "sparkstate"


def server_only(path: "str | os.PathLike") -> str:
    """The local ``path`` as a URI only the test server reaches: ``viewfs://sparkstate/PATH``."""
    return f"viewfs://{VIEWFS_MOUNT}{os.fspath(path)}"


#: The module of the Python process a Connect server starts for each ``foreachBatch`` query.
FOREACH_BATCH_WORKER = "pyspark.sql.connect.streaming.worker.foreach_batch_worker"


@dataclass
class ConnectServer:
    url: str
    proc: subprocess.Popen
    log: Path
    python: RefusingPython  # the server's Python: its foreachBatch processes can be made to fail to start

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)

    def remove(self) -> None:
        """Stop the server and delete its directory (log, Python wrapper, refusal flags)."""
        self.stop()
        shutil.rmtree(self.log.parent, ignore_errors=True)


def start(timeout: float = 240.0) -> ConnectServer:
    import pyspark

    from sparkstate.io import connectors

    home = Path(pyspark.__file__).parent
    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="sparkstate-connect-"))
    log = root / "server.log"
    confs = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        # viewfs://sparkstate/PATH is the server's local PATH: a store only the server reaches (the
        # client's pyarrow.fs has no way to viewfs://), as dbfs:/ or hdfs:// can be for a client.
        f"spark.hadoop.fs.viewfs.mounttable.{VIEWFS_MOUNT}.linkFallback": "file:///",
    }
    jars = connectors.spark_settings(kafka=True).get("spark.jars")
    cmd = [str(home / "bin" / "spark-submit"), "--master", "local[2]", "--class", SERVER_CLASS]
    for k, v in confs.items():
        cmd += ["--conf", f"{k}={v}"]
    if jars:
        cmd += ["--jars", jars]
    cmd.append("spark-internal")
    python = RefusingPython(root, FOREACH_BATCH_WORKER)
    env = dict(os.environ, PYSPARK_PYTHON=str(python.path), SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1")
    from sparkstate.jvm_archive import driver_option

    if (archive := driver_option()) is not None:  # the server's driver JVM starts from the class-data archive too
        env["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [env.get("SPARK_SUBMIT_OPTS"), archive]))
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
                                start_new_session=True)
    server = ConnectServer(f"sc://127.0.0.1:{port}", proc, log, python)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if "Spark Connect server started" in log.read_text(errors="replace"):
            return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"the Spark Connect server did not start in {timeout:.0f} s:\n{log.read_text()[-3000:]}")

