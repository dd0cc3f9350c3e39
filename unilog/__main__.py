"""``python -m unilog`` runs the ``unilog`` command."""

import sys

from .cli import main

sys.exit(main())
