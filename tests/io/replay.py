"""Make Spark replay a micro-batch: forget that the last batch was committed."""

from __future__ import annotations

from pathlib import Path


def drop_last_commit(checkpoint: Path) -> int:
    """Delete the newest ``checkpoint/commits/N`` (and its .crc), as if the driver died right after
    the sink committed batch N but before Spark logged the commit. A restart re-runs batch N with
    the same offsets. Returns N.
    """
    commits = Path(checkpoint) / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    return last
