"""docs/vectorized.md's side-by-side functions agree: each map_batches_with_state version gives the
map_groups_with_state version's outputs and states, on the two harnesses (no Spark)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pandas as pd

import sparkstate as ss

DOC = Path(__file__).resolve().parents[2] / "docs" / "vectorized.md"


def definitions() -> dict:
    """The doc's python blocks, without the statements that need a DataFrame (``out = ...``)."""
    ns: dict = {"ss": ss, "np": np, "pd": pd}
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        tree = ast.parse(block)
        tree.body = [n for n in tree.body if not (isinstance(n, ast.Assign) and n.targets[0].id in ("out", "h"))
                     and not isinstance(n, ast.Expr)]
        exec(compile(tree, str(DOC), "exec"), ns)
    return ns


def test_running_count_side_by_side():
    ns = definitions()
    per_key = ss.testing.GroupStateHarness(ns["count"], state_type=int)
    batched = ss.testing.BatchStateHarness(ns["count_batch"], key="word", state_type=int)
    for words in (["a", "b", "a"], ["b"], ["c", "a", "c", "c"]):
        want = sorted(o for w in dict.fromkeys(words) for o in per_key.feed(w, [w] * words.count(w)))
        got = sorted(tuple(r) for r in batched.run_batch(pd.DataFrame({"word": words})).itertuples(index=False))
        assert got == want


def test_idle_sum_side_by_side():
    ns = definitions()
    pt = ss.GroupStateTimeout.ProcessingTimeTimeout
    per_key = ss.testing.GroupStateHarness(ns["user_sum"], state_type=float, timeout=pt)
    batched = ss.testing.BatchStateHarness(ns["user_sum_batch"], key="user", state_type=float, timeout=pt)
    idle = ns["IDLE"]
    script = [(0, [("a", 1.0), ("b", 2.0)]), (idle // 2, [("a", 3.0)]), (idle + 1, [("c", 5.0)]),
              (idle * 2, []), (idle * 4, [])]
    for t, rows in script:
        data: dict = {}
        for user, amount in rows:
            data.setdefault(user, []).append(pd.Series({"amount": amount}))
        want = sorted(per_key.run_batch(data, processing_time=t))
        frame = pd.DataFrame(rows, columns=["user", "amount"]) if rows else None
        got = sorted(tuple(r) for r in batched.run_batch(frame, processing_time=t).itertuples(index=False))
        assert got == want, t
        assert sorted(batched.keys()) == sorted(per_key.keys())
    assert batched.keys() == []
