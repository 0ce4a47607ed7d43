"""Runs tests/connect (sparkstate over a real Spark Connect server) in pytest processes of their own.

PySpark turns a whole process to Spark Connect once it makes a remote session, and the rest of
the suite shares one classic session per process; so each Connect module runs in a child pytest
that starts its own server (tests/connect/server.py) and stops it at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MODULES = ["tests/connect/test_connect_api.py", "tests/connect/test_connect_jobs.py"]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("module", MODULES)
def test_connect_module(module):
    env = {**os.environ, "SPARKSTATE_CONNECT_TESTS": "1"}
    env.pop("SPARK_REMOTE", None)
    done = subprocess.run([sys.executable, "-m", "pytest", module, "-q", "-n", "0", "-p", "no:cacheprovider",
                           "--timeout", "900", "-o", "addopts=--strict-markers"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1700)
    summary = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    assert done.returncode == 0, f"{module}: {summary}\n{done.stdout[-12000:]}\n{done.stderr[-3000:]}"
    assert " passed" in done.stdout and " failed" not in done.stdout
