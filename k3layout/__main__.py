"""``python -m k3layout``: the command line."""

import sys

from .cli import main

sys.exit(main())
