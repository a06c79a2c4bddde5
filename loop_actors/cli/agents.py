"""The agent a command runs, named ``MODULE:ATTR`` (as uvicorn names an app)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from loop_actors._errors import AgentLoadError
from loop_actors.agent.agent import Agent


def load_agent(reference: str) -> Agent:
    """Import ``MODULE:ATTR`` (like uvicorn) and check that it is an Agent.

    Raises:
        AgentLoadError: the module or attribute is missing, or is not an Agent.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise AgentLoadError(f"expected MODULE:ATTR, got {reference!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise AgentLoadError(f"cannot import module {module_name!r}: {error}") from error
    except Exception as error:
        raise AgentLoadError(
            f"importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from error
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise AgentLoadError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(value, Agent):
        raise AgentLoadError(f"{reference} is a {type(value).__name__}, not a loop_actors.Agent")
    return value
