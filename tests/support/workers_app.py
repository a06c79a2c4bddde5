"""The payment agent of ``payments_app`` with a model that takes its time, for the worker stories.

``$WORKERS_MODEL_DELAY_S`` (default 0.05) is how long each decision takes: long
enough that a worker holds leases when it is killed or stopped.
"""

from __future__ import annotations

import os
from typing import Any

import trio
from payments_app import _decide, pay, read_balance  # type: ignore[import-not-found]

from loop_actors import Agent, Budget, ModelRequest, ScriptedModel


async def _slow_decide(request: ModelRequest) -> dict[str, Any]:
    await trio.sleep(float(os.environ.get("WORKERS_MODEL_DELAY_S", "0.05")))
    decision: dict[str, Any] = _decide(request)
    return decision


agent = Agent("payments", ScriptedModel(_slow_decide), [read_balance, pay], Budget(max_steps=6))
