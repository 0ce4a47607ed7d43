"""The README's examples run as written (paths pointed at a temporary directory)."""

from __future__ import annotations

import ast
import json
import sys
import types
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_example_runs_on_spark_and_its_harness_snippet_holds(spark, tmp_path):
    example, harness = python_blocks()[:2]
    events = tmp_path / "events"
    events.mkdir()
    (events / "a.json").write_text("\n".join(json.dumps(r) for r in [
        {"id": 1, "data": "home", "is_last": False},
        {"id": 1, "data": "cart", "is_last": True},
        {"id": 2, "data": "home", "is_last": False},
    ]) + "\n")
    code = example.replace('"events/"', repr(str(events))).replace('"checkpoint/"', repr(str(tmp_path / "ck")))
    code = code.replace('format("console")', 'format("memory").queryName("readme_sessions")')
    assert "query.awaitTermination()" in code
    code = code.replace("query.awaitTermination()", "")
    # Run it as a module of its own (as a user's script is __main__): type hints resolve in it,
    # and workers receive its functions and dataclasses by value.
    from pyspark import cloudpickle

    module = types.ModuleType("readme_example")
    sys.modules[module.__name__] = module
    cloudpickle.register_pickle_by_value(module)
    ns = module.__dict__
    exec(compile(code, "README.md", "exec"), ns)
    query = ns["query"]
    try:
        deadline = time.time() + 120
        while not spark.table("readme_sessions").count() and time.time() < deadline:
            assert query.isActive, query.exception()
            time.sleep(0.2)
        rows = [tuple(r) for r in spark.table("readme_sessions").collect()]
    finally:
        query.stop()
    assert rows == [(1, ["home", "cart"], "last_event")]

    # The harness snippet: a statement ending in "# -> X" must evaluate to X.
    lines = harness.splitlines()
    checked = 0
    for node in ast.parse(harness).body:
        src = ast.get_source_segment(harness, node)
        _, _, expected = lines[node.end_lineno - 1].partition("# ->")
        if expected:
            assert eval(src, ns) == eval(expected.strip()), src
            checked += 1
        else:
            exec(src, ns)
    assert checked == 2
