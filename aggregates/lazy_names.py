"""A package's public names, each imported when it is first used (PEP 562).

``aggregates``, ``projections`` and ``loop_actors`` re-export their public names from
the modules that define them. Imported up front, one ``import aggregates.values`` built
every pydantic model of the domain, and ``import loop_actors`` imported trio: each
package lists its names instead (with the same imports under ``TYPE_CHECKING``, for
type checkers and editors) and imports a name's module when the name is first used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def lazy_names(
    namespace: MutableMapping[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__`` for ``exports`` (name: its module).

    ``namespace`` is the package's ``globals()`` (with its ``__all__``); a name once
    imported is put there, so that its next use does not come back here.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        """Import a public name's module the first time the name is used."""
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        """The names found here and the public ones, imported or not."""
        return sorted({*namespace, *namespace["__all__"]})

    return __getattr__, __dir__
