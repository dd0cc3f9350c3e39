"""``python -m unilog.harness.chaos produce | streamer | consume | spark``: the chaos fleet's processes."""

import sys

from .processes import main

sys.exit(main())
