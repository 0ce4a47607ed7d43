"""docs/porting.md's Python blocks run as written, in order, in one namespace, on local Spark.

The Kafka block reads a real topic from the tests' broker (``KAFKA_BROKERS``); Spark's own
stateful operator writes the checkpoint that the last block moves into sparkstate.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "porting.md").read_text(), re.S)


def test_every_scala_section_has_its_python_side():
    text = (ROOT / "docs" / "porting.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[2:]   # after the intro and the table
    for section in sections:
        title = section.splitlines()[0]
        assert "```python" in section, f"section {title!r} has no Python block"
    assert len(python_blocks()) >= 8


def test_the_porting_guide_runs(kafka_spark, kafka_broker, monkeypatch, capsys):
    topic = "visited-pages-porting"
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [("a", json.dumps(["page0"])), ("a", json.dumps(["page1", "page2"])),
                                 ("gone", json.dumps(["x"])), ("gone", None)])
    monkeypatch.setenv("KAFKA_BROKERS", kafka_broker.bootstrap)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    # A module of its own, as a user's script: its functions and dataclasses travel by value.
    from pyspark import cloudpickle

    module = types.ModuleType("porting_guide")
    sys.modules[module.__name__] = module
    cloudpickle.register_pickle_by_value(module)
    try:
        for i, block in enumerate(python_blocks()):
            exec(compile(block, f"docs/porting.md block {i}", "exec"), module.__dict__)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        del sys.modules[module.__name__]
    printed = capsys.readouterr().out
    # the Kafka block: the latest record per key, a deleted key left out
    assert "[('a', ['page1', 'page2', 'page3']), ('b', ['page5'])]" in printed
