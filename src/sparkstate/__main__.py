"""``python -m sparkstate``: the ``sparkstate`` command."""

import sys

from .cli import main

sys.exit(main())
