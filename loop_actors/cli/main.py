"""``python -m loop_actors.cli.main``: the ``loop-actors`` command, as before the split.

The entry point itself is :func:`loop_actors.cli.main` (defined in ``entry``): a module
named ``main`` cannot hold it, since importing the module would rebind the package's
``main`` attribute to the module.
"""

from __future__ import annotations

import sys

from loop_actors.cli.entry import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
