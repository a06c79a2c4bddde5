"""ToolOptions: the options of ``@tool`` declared once, and the decorator that spells them.

Bad inputs tried: an unknown keyword to ``Tool``, options and keywords together,
a write to a frozen ToolOptions, an unknown field, values pydantic would coerce
(an int timeout, a list of names, a string of names).
"""

from __future__ import annotations

import inspect

import pydantic
import pytest

from loop_actors import Tool, ToolDefinitionError, tool
from loop_actors.agent.tools import ToolOptions


def lookup(key: str) -> str:
    """Look a key up."""
    return key


def test_the_decorator_keywords_are_the_fields_of_tool_options() -> None:
    """Each keyword of ``tool`` is a field of ToolOptions, in order, with its default."""
    parameters = list(inspect.signature(tool).parameters.values())
    assert parameters[0].name == "fn"
    assert parameters[0].kind is inspect.Parameter.POSITIONAL_ONLY
    keywords = parameters[1:]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keywords)
    assert [p.name for p in keywords] == list(ToolOptions.model_fields)
    assert {p.name: p.default for p in keywords} == {
        name: field.default for name, field in ToolOptions.model_fields.items()
    }


def test_tool_options_has_the_thirteen_options() -> None:
    assert list(ToolOptions.model_fields) == [
        "name",
        "description",
        "effect",
        "timeout_s",
        "inline",
        "reconcile",
        "commutes",
        "sensitive_arguments",
        "sensitive_output",
        "requires_approval",
        "max_repeated_failures",
        "operation",
        "object_from",
    ]


def test_a_decorated_tool_keeps_its_options_as_given() -> None:
    """Values are not coerced: an int timeout stays an int, a list stays the list."""
    names = ["key"]
    made = tool(timeout_s=2, sensitive_arguments=names, effect="write")(lookup)
    assert made.options == ToolOptions(timeout_s=2, sensitive_arguments=names, effect="write")
    assert made.options.timeout_s == 2
    assert type(made.options.timeout_s) is int
    assert made.options.sensitive_arguments is names
    assert made.timeout_s == 2
    assert made.sensitive_arguments == (("key",),)


def test_tool_takes_the_same_keywords_or_one_options() -> None:
    by_keywords = Tool(lookup, effect="write", operation="look")
    by_options = Tool(lookup, options=ToolOptions(effect="write", operation="look"))
    assert by_keywords.options == by_options.options
    assert (by_keywords.effect, by_keywords.operation) == (by_options.effect, by_options.operation)


def test_tool_refuses_an_unknown_keyword() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'nam'"):
        Tool(lookup, nam="other")


def test_tool_refuses_options_and_keywords_together() -> None:
    with pytest.raises(TypeError, match="not both"):
        Tool(lookup, options=ToolOptions(), name="other")


def test_tool_options_are_frozen_and_closed() -> None:
    options = ToolOptions()
    with pytest.raises(pydantic.ValidationError):
        options.inline = True  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        ToolOptions(nam="other")  # type: ignore[call-arg]


def test_malformed_options_are_refused_by_the_tool_with_its_name() -> None:
    """The checks stay Tool's: ToolDefinitionError naming the tool, not a pydantic error."""
    with pytest.raises(ToolDefinitionError, match="tool lookup: give sensitive fields as a list"):
        tool(sensitive_arguments="key")(lookup)
    with pytest.raises(ToolDefinitionError, match="tool lookup: effect must be 'read' or 'write'"):
        tool(effect="delete")(lookup)  # type: ignore[call-overload]
