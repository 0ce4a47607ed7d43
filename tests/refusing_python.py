"""A Python for Spark to start that refuses some starts: the fault of a Python process that does
not connect back to Spark within its fixed 10 s (a machine too busy to start it in time)."""

from __future__ import annotations

import sys
from pathlib import Path


class RefusingPython:
    """``path`` is a shell script that runs this interpreter, except that a start of a process
    whose command line names ``module`` exits at once while the count in ``refusals`` is above 0
    (taking one off). Spark then waits its 10 s and fails with "Python worker failed to connect back"."""

    def __init__(self, root: Path, module: str) -> None:
        self.path = root / "python"
        self.refusals = root / "refusals"
        self.refusals.write_text("0")
        self.path.write_text(
            "#!/bin/sh\n"
            f'case "$*" in *{module}*)\n'
            f'  n=$(cat "{self.refusals}")\n'
            f'  if [ "$n" -gt 0 ]; then echo $((n - 1)) > "{self.refusals}"; exit 3; fi;;\n'
            "esac\n"
            f'exec "{sys.executable}" "$@"\n')
        self.path.chmod(0o755)

    def refuse(self, n: int) -> None:
        """Make the next ``n`` starts of the module exit at once."""
        self.refusals.write_text(str(n))

    def left(self) -> int:
        return int(self.refusals.read_text() or 0)
