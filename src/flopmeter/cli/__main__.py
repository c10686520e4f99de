"""``python -m flopmeter.cli``: the ``flopmeter`` command."""

import sys

from flopmeter.cli import main

sys.exit(main())
