"""docs/operations.md: every metrics field the code writes is documented; its listener example runs."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

from sparkstate.observe.metrics import BatchMetrics, batch_metrics

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "operations.md").read_text()


def test_the_metrics_reference_lists_every_field_the_code_writes():
    section = DOC.split("## The metrics file", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, re.M)
    written = list(batch_metrics({"batchId": 0, "numInputRows": 0}, "output").to_dict())
    assert written == [f.name for f in dataclasses.fields(BatchMetrics)]
    assert documented == written, "docs/operations.md's metrics table must list the fields in the order written"


def test_the_listener_example_runs(spark, capsys):
    block = re.findall(r"```python\n(.*?)```", DOC, re.S)[0]
    from pyspark import cloudpickle

    module = types.ModuleType("operations_listener")
    sys.modules[module.__name__] = module
    cloudpickle.register_pickle_by_value(module)
    try:
        exec(compile(block, "docs/operations.md", "exec"), module.__dict__)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        del sys.modules[module.__name__]
    batch_id, duration, state_rows = module.__dict__["watcher"].batches[0]
    assert batch_id >= 0 and duration > 0 and state_rows >= 0
    assert f"({batch_id}, " in capsys.readouterr().out
