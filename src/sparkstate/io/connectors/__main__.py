"""``python -m sparkstate.io.connectors fetch|coordinates ...``: :func:`sparkstate.io.connectors.main`.

A module of its own, so that running the package does not load its code a second time beside
the copy ``sparkstate.io`` already imported (Python warns about that, and two copies of a module
keep two copies of its state)."""

from __future__ import annotations

from . import main

if __name__ == "__main__":
    raise SystemExit(main())
