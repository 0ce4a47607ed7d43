"""A virtualenv per supported PySpark minor (other than the main one), made once under the cache dir.

``$SPARKSTATE_CACHE/venvs/pyspark-X.Y.Z`` (default ``~/.cache/sparkstate``) holds this project
installed in editable mode with ``pyspark[connect]==X.Y.Z`` pinned. A stamp file records the
pinned version, the checkout installed and a hash of pyproject.toml; a venv whose stamp differs
is brought up to date (a different checkout only needs the project re-installed, without deps).

Made and filled by uv (a test dependency), whose cache the venvs share: on a fresh machine a
venv takes about a third of what venv and pip took (22 s against 59 s for pyspark 4.2.1).

``python -m tests.versions.venvs`` makes every matrix venv ahead of time (what CI may cache).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from sparkstate.io.connectors import MATRIX_PYSPARK, cache_dir

ROOT = Path(__file__).resolve().parents[2]
#: What pip cannot work out by itself for a minor: pyspark 3.5 pins numpy < 2, and pyarrow 26 and
#: later need NumPy 2 at import (pyarrow declares no numpy dependency, so pip would pick 26).
EXTRA_PINS = {"3.5": ("pyarrow<26",)}


def _pyproject_hash() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]


def venv_dir(version: str) -> Path:
    return cache_dir() / "venvs" / f"pyspark-{version}"


def python(version: str) -> Path:
    return venv_dir(version) / "bin" / "python"


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")


def ensure(version: str) -> Path:
    """The python of the venv for pyspark ``version``, made or updated as needed."""
    d = venv_dir(version)
    stamp = d / "sparkstate-venv.json"
    want = {"pyspark": version, "root": str(ROOT), "pyproject": _pyproject_hash()}
    have = json.loads(stamp.read_text()) if stamp.exists() else {}
    if have == want:
        return python(version)
    py = python(version)
    uv = [sys.executable, "-m", "uv", "--quiet"]
    if not py.exists():
        _run([*uv, "venv", "--clear", "--python", sys.executable, str(d)])
    pip = [*uv, "pip", "install", "--python", str(py)]
    if have.get("pyspark") == version and have.get("pyproject") == want["pyproject"]:
        _run([*pip, "--no-deps", "-e", str(ROOT)])  # another checkout: the project only
    else:
        _run([*pip, "-e", f"{ROOT}[test]", f"pyspark[connect]=={version}", *EXTRA_PINS.get(version[:3], ())])
    stamp.write_text(json.dumps(want), encoding="utf-8")
    return py


def main() -> int:
    for v in MATRIX_PYSPARK.values():
        print(v, ensure(v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
