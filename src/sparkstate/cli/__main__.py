"""``python -m sparkstate.cli``: the same as the ``sparkstate`` command."""

import sys

from . import main

sys.exit(main())
