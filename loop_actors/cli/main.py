"""``python -m loop_actors.cli.main``: the ``loop-actors`` command, as before the split.

The entry point itself is :func:`loop_actors.cli.main` (defined in ``entry``). Importing
this module rebinds the package's ``main`` attribute to the module (the import system
sets a package's attribute to each submodule it loads), so that a later ``from
loop_actors.cli import main`` would get a module: the module is made callable, with
the entry point's signature, so that it works either way.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence

from loop_actors.cli.entry import main

__all__ = ["main"]


class _CallableModule(types.ModuleType):
    """This module, callable as the entry point it holds."""

    def __call__(self, argv: Sequence[str] | None = None) -> int:
        return main(argv)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
