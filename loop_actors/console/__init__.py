"""The operator console: ``loop-actors serve`` (pages, a JSON API, live event streams).

Needs the ``console`` extra (``pip install 'loop-actors[console]'``): Starlette,
sse-starlette and hypercorn, whose trio worker serves the app in the process that
holds the runtime. See docs/how-to/watch-and-approve-from-the-console.md and
docs/reference/console-api.md.

Every name below is imported when first used (PEP 562): ``loop-actors watch`` follows
an invocation (``follow``) without the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregates.lazy_names import lazy_names

if TYPE_CHECKING:
    from loop_actors.console.app import create_app as create_app
    from loop_actors.console.app import serve_console as serve_console
    from loop_actors.console.bulk import ConsoleRuns as ConsoleRuns
    from loop_actors.console.follow import follow_history as follow_history
    from loop_actors.console.settings import TOKEN_ENV as TOKEN_ENV
    from loop_actors.console.settings import ConsoleSettings as ConsoleSettings

_EXPORTS: dict[str, str] = {
    "create_app": "loop_actors.console.app",
    "ConsoleRuns": "loop_actors.console.bulk",
    "serve_console": "loop_actors.console.app",
    "follow_history": "loop_actors.console.follow",
    "TOKEN_ENV": "loop_actors.console.settings",
    "ConsoleSettings": "loop_actors.console.settings",
}
"""Each public name and the module it is defined in (under the same name)."""

__all__ = [
    "TOKEN_ENV",
    "ConsoleRuns",
    "ConsoleSettings",
    "create_app",
    "follow_history",
    "serve_console",
]

__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)
