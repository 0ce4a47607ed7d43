"""docs/api.md stays true: every name it lists exists, and every module's ``__all__`` is listed (no Spark)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
SECTION = re.compile(r"^## `(sparkstate(?:\.\w+)*)`\s*$")
NAME = re.compile(r"`([A-Za-z_][\w.]*)")


def listed() -> dict[str, list[str]]:
    """Per module section of docs/api.md, the names its entries (``- `name...`: ...``) list."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in API.read_text(encoding="utf-8").splitlines():
        heading = SECTION.match(line)
        if heading:
            current = sections.setdefault(heading.group(1), [])
        elif current is not None and line.startswith("- `"):
            current.extend(NAME.findall(line.split("`: ", 1)[0]))
    return sections


def test_every_listed_name_exists():
    sections = listed()
    assert len(sections) >= 8 and sum(map(len, sections.values())) > 100
    missing = []
    for module, names in sections.items():
        mod = importlib.import_module(module)
        for name in names:
            obj = mod
            for part in name.split("."):
                obj = getattr(obj, part, missing)
                if obj is missing:
                    missing.append(f"{module}.{name}")
                    break
    assert missing == [], f"docs/api.md lists names that do not exist: {missing}"


def test_every_public_name_is_listed():
    unlisted = []
    for module, names in listed().items():
        heads = {n.split(".")[0] for n in names}
        unlisted += [f"{module}.{n}" for n in getattr(importlib.import_module(module), "__all__", ()) if n not in heads]
    assert unlisted == [], f"public names missing from docs/api.md: {unlisted}"
