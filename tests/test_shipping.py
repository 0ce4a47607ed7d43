"""State functions and types from the user's own modules reach the Python workers.

The user's code lives in a temporary folder outside the repository and is run the way a user
runs it, in a subprocess whose working directory is yet another folder, with no PYTHONPATH:

- a pytest test module (pytest puts its folder on ``sys.path``, "prepend" import mode) whose
  state function and dataclass live in a module beside it, which uses a third module of the
  user's: a real streaming query on both engines, then a second pytest run (a new process) that
  restarts both queries from their checkpoints; the state tools then read what they stored;
- a script whose state function comes from a package installed for the driver only (on its
  ``sys.path``, not on the workers'): the query fails at start with one line naming the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sparkstate as ss

ENGINES = ("tws", "batched")

STATE_MODULE = '''\
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import shop_helpers  # another module of the user's, beside this one


@dataclass
class Tally:
    n: int = 0
    pages: list[str] = field(default_factory=list)
    last: Optional[str] = None


def tally(user, rows, state):
    t = state.get if state.exists else Tally()
    assert isinstance(t, Tally), type(t)  # the state comes back as the user's own class
    for r in rows:
        t.n += 1
        t.pages.append(shop_helpers.clean(r.page))
        t.last = r.page
    state.update(t)
    return (user, t.n, ",".join(sorted(t.pages)))
'''

HELPERS_MODULE = '''\
def clean(page):
    return page.strip("/").upper()
'''

# The user's test: one pytest run per "run" of the job; both runs use the same checkpoints.
USER_TEST = '''\
import importlib.util
import json
import os

import sparkstate as ss
from shop_state import Tally, tally  # importable because pytest put this folder on sys.path


def test_user_query():
    spark = ss.spark_session("user", master="local[2]", config={"spark.sql.shuffle.partitions": "2"})
    # the workers cannot import the user's modules: whatever works below was shipped to them
    probe = spark.sparkContext.parallelize([0], 1).map(
        lambda _: importlib.util.find_spec("shop_state") is None and importlib.util.find_spec("shop_helpers") is None)
    assert probe.collect() == [True]
    work = os.environ["USER_WORK"]
    results = {}
    for engine in ("tws", "batched"):
        df = spark.readStream.schema("user string, page string").json(os.path.join(work, "in-" + engine))
        out = ss.map_groups_with_state(df, key="user", func=tally, state_type=Tally,
                                       output_type="user string, n long, pages string", engine=engine)
        rows = []
        q = (out.writeStream.outputMode("update")
             .foreachBatch(lambda batch, _id: rows.extend(tuple(r) for r in batch.collect()))
             .option("checkpointLocation", os.path.join(work, "ck-" + engine)).start())
        try:
            q.processAllAvailable()
        finally:
            q.stop()
        results[engine] = sorted(rows)
    with open(os.path.join(work, "out-" + os.environ["USER_RUN"] + ".json"), "w") as f:
        json.dump(results, f)
'''

RUN_1 = [{"user": "u1", "page": "/a"}, {"user": "u2", "page": "/b"}, {"user": "u1", "page": "/c"}]
RUN_2 = [{"user": "u1", "page": "/d"}, {"user": "u3", "page": "/e"}]


def _env() -> dict[str, str]:
    # Nothing that would let the workers import the user's modules by path.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}


def _write_json_lines(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_state_function_from_a_pytest_module_outside_the_project_on_both_engines(tmp_path, spark):
    project = tmp_path / "userproject" / "checks"  # no __init__.py: pytest prepends this folder
    project.mkdir(parents=True)
    (project / "shop_state.py").write_text(STATE_MODULE)
    (project / "shop_helpers.py").write_text(HELPERS_MODULE)
    (project / "test_user_query.py").write_text(USER_TEST)
    work = tmp_path / "work"
    elsewhere = tmp_path / "elsewhere"  # the test runner's working directory
    elsewhere.mkdir()
    for engine in ENGINES:
        (work / f"in-{engine}").mkdir(parents=True)

    def run(n: int, records: list[dict]) -> dict:
        for engine in ENGINES:
            _write_json_lines(work / f"in-{engine}" / f"{n}.json", records)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "test_user_query.py")],
            cwd=elsewhere, env={**_env(), "USER_WORK": str(work), "USER_RUN": str(n)},
            capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return json.loads((work / f"out-{n}.json").read_text())

    first = run(1, RUN_1)
    assert first == {e: [["u1", 2, "A,C"], ["u2", 1, "B"]] for e in ENGINES}
    # a new process, restarted from the checkpoints: the state of run 1 is read back as Tally
    second = run(2, RUN_2)
    assert second == {e: [["u1", 3, "A,C,D"], ["u3", 1, "E"]] for e in ENGINES}

    # The stored state is plain columns: the state tools read it in a process that never
    # imported the user's modules.
    for engine in ENGINES:
        stored = sorted(tuple(r) for r in ss.state.read(spark, work / f"ck-{engine}").drop("timeout_ms").collect())
        assert stored == [("u1", 3, ["A", "C", "D"], "/d"), ("u2", 1, ["B"], "/b"), ("u3", 1, ["E"], "/e")], engine


FAILING_SCRIPT = '''\
import os
import sys

sys.path.insert(0, os.environ["DRIVER_ONLY_SITE"])  # a package installed for the driver only

import sparkstate as ss
from shop_rules import Count, count

spark = ss.spark_session("user", master="local[1]", config={"spark.sql.shuffle.partitions": "1"})
for engine in ("tws", "batched"):
    df = spark.readStream.schema("user string").json(os.environ["USER_IN"])
    out = ss.map_groups_with_state(df, key="user", func=count, state_type=Count,
                                   output_type="user string, n long", engine=engine)
    q = (out.writeStream.outputMode("update").format("memory").queryName("counts_" + engine)
         .option("checkpointLocation", os.path.join(os.environ["USER_WORK"], "ck-" + engine)).start())
    try:
        q.awaitTermination()
    except Exception as exc:
        print("BATCHES", engine, q.lastProgress is not None)
        print("LINE", engine, ss.errors.explain(exc))
        print("RAW", engine, "sparkstate.errors.WorkerImportError: " in str(exc))
'''


def test_a_module_the_workers_cannot_import_fails_the_query_with_one_line(tmp_path):
    # `pip install --target site shop-rules` for the driver: a package with its metadata,
    # importable only through the driver's sys.path.
    site = tmp_path / "driver-site"
    (site / "shop_rules").mkdir(parents=True)
    (site / "shop_rules" / "__init__.py").write_text(textwrap.dedent('''\
        from dataclasses import dataclass


        @dataclass
        class Count:
            n: int = 0


        def count(user, rows, state):
            c = state.get if state.exists else Count()
            c.n += sum(1 for _ in rows)
            state.update(c)
            return (user, c.n)
    '''))
    meta = site / "shop_rules-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: shop-rules\nVersion: 1.0\n")
    (meta / "top_level.txt").write_text("shop_rules\n")
    (meta / "RECORD").write_text("shop_rules/__init__.py,,\nshop_rules-1.0.dist-info/METADATA,,\n")
    script = tmp_path / "app" / "job.py"
    script.parent.mkdir()
    script.write_text(FAILING_SCRIPT)
    land = tmp_path / "in"
    land.mkdir()
    _write_json_lines(land / "1.json", [{"user": "u1"}])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, str(script)], cwd=elsewhere, capture_output=True, text=True, timeout=900,
                          env={**_env(), "DRIVER_ONLY_SITE": str(site), "USER_IN": str(land),
                               "USER_WORK": str(tmp_path / "work")})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    want = ("WorkerImportError: the Python workers cannot import module 'shop_rules' (needed by the state function"
            " 'count' of map_groups_with_state); it is installed where the driver runs but not on the workers."
            " Install it on the workers, ship it with spark-submit --py-files (spark.submit.pyFiles), or define"
            " the function in the main script.")
    for engine in ENGINES:
        assert f"LINE {engine} {want}" in lines, done.stdout[-4000:]
        assert f"RAW {engine} True" in lines
        assert f"BATCHES {engine} False" in lines  # it failed at start, before any batch ran


def test_which_modules_travel_by_value(tmp_path, monkeypatch):
    import importlib
    import json as json_module

    import pandas

    from sparkstate import shipping

    (tmp_path / "mine.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = importlib.import_module("mine")
    assert shipping.ships_by_value("mine", mine)
    assert shipping.ships_by_value(__name__, sys.modules[__name__])  # this repository's tests: not installed
    assert not shipping.ships_by_value("json", json_module)  # standard library
    assert not shipping.ships_by_value("pandas", pandas)  # site-packages
    assert not shipping.ships_by_value("sparkstate.types", sys.modules["sparkstate.types"])  # editable install
    assert not shipping.ships_by_value("pyspark.sql", sys.modules["pyspark.sql"])
    assert not shipping.ships_by_value("sys", sys)  # built in


def test_an_import_inside_the_function_that_fails_on_a_worker_names_the_module():
    from sparkstate.engines.rules import run_call
    from sparkstate.group_state import GroupState

    def enrich(user, rows, state):
        import shop_catalogue_not_installed  # noqa: F401  (run at call time, on the worker)

    with pytest.raises(ss.UserFunctionError) as err:
        run_call(enrich, "u1", iter(()), GroupState(), flat=False, old_timeout_ms=None, keep_expired_state=False)
    assert str(err.value) == (
        "the state function 'enrich' raised ModuleNotFoundError: No module named 'shop_catalogue_not_installed'"
        " (key 'u1'): the Python workers cannot import 'shop_catalogue_not_installed'. Import it at the top of"
        " the function's module (a module that is not installed then travels with the query), install it on the"
        " workers, or ship it with spark-submit --py-files.")
