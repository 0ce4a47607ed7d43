"""A real Spark Connect server for the tests: the pyspark wheel's own SparkConnectServer, on a
free loopback port, its Python workers on this interpreter, Spark's Kafka connector on its
classpath (the jars `make kafka` fetched), stopped at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


#: The module of the Python process a Connect server starts for each ``foreachBatch`` query.
FOREACH_BATCH_WORKER = "pyspark.sql.connect.streaming.worker.foreach_batch_worker"


@dataclass
class ConnectServer:
    url: str
    proc: subprocess.Popen
    log: Path
    refusals: Path  # how many foreachBatch processes to come will exit at once (see _python_for_workers)

    def refuse_foreach_batch_starts(self, n: int) -> None:
        """Make the next ``n`` foreachBatch processes of the server exit at start, never connecting back."""
        self.refusals.write_text(str(n))

    def refusals_left(self) -> int:
        return int(self.refusals.read_text() or 0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


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
    }
    jars = connectors.spark_settings(kafka=True).get("spark.jars")
    cmd = [str(home / "bin" / "spark-submit"), "--master", "local[2]", "--class", SERVER_CLASS]
    for k, v in confs.items():
        cmd += ["--conf", f"{k}={v}"]
    if jars:
        cmd += ["--jars", jars]
    cmd.append("spark-internal")
    refusals = root / "refuse-foreach-batch"
    refusals.write_text("0")
    env = dict(os.environ, PYSPARK_PYTHON=str(_python_for_workers(root, refusals)), SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
                                start_new_session=True)
    server = ConnectServer(f"sc://127.0.0.1:{port}", proc, log, refusals)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if "Spark Connect server started" in log.read_text(errors="replace"):
            return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"the Spark Connect server did not start in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _python_for_workers(root: Path, refusals: Path) -> Path:
    """The server's Python: this interpreter, except that a foreachBatch process started while
    ``refusals`` holds a count above 0 takes one off and exits at once, as a Python that did not
    come up would (Spark waits its 10 s for it to connect back, then fails the start)."""
    script = root / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *{FOREACH_BATCH_WORKER}*)\n'
        f'  n=$(cat "{refusals}")\n'
        f'  if [ "$n" -gt 0 ]; then echo $((n - 1)) > "{refusals}"; exit 3; fi;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return script
