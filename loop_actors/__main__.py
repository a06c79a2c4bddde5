"""``python -m loop_actors``: the ``loop-actors`` command."""

import sys

from loop_actors.cli import main

sys.exit(main())
