"""The Java reference, compiled at benchmark time against the jars the ``pyspark`` wheel ships.

``build_jar(dest)`` runs ``javac -cp "<pyspark>/jars/*"`` on ``benchmarks/java/**/*.java`` and
packs the classes with ``jar`` into ``dest/sparkstate-bench.jar``; the benchmark SparkSession
gets it through ``spark.driver.extraClassPath`` (local mode: the driver is the executor).
Nothing is downloaded and no class or jar is kept in the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

JAVA_SOURCES = Path(__file__).resolve().parent / "java"
JAR_NAME = "sparkstate-bench.jar"


class JavaBuildError(RuntimeError):
    """javac or jar failed, or is missing; the message has their output."""


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / name
        found = str(candidate) if candidate.exists() else None
    if found is None:
        raise JavaBuildError(f"`{name}` not found on PATH (or in $JAVA_HOME/bin): the Java reference needs a JDK 17+")
    return found


def build_jar(dest: Path) -> Path:
    """Compile the Java contenders into ``dest/sparkstate-bench.jar`` and return its path."""
    sources = sorted(str(p) for p in JAVA_SOURCES.rglob("*.java"))
    if not sources:
        raise JavaBuildError(f"no Java sources under {JAVA_SOURCES}")
    dest.mkdir(parents=True, exist_ok=True)
    jar = dest / JAR_NAME
    with tempfile.TemporaryDirectory(prefix="sparkstate-bench-classes-") as classes:
        compile_cmd = [_tool("javac"), "-nowarn", "-encoding", "UTF-8", "--release", "17",
                       "-cp", f"{pyspark_jars()}/*", "-d", classes, *sources]
        done = subprocess.run(compile_cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise JavaBuildError(f"javac failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        done = subprocess.run([_tool("jar"), "cf", str(jar), "-C", classes, "."], capture_output=True, text=True)
        if done.returncode != 0:
            raise JavaBuildError(f"jar failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return jar
