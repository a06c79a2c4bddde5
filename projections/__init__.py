"""Read models built from the event stream: they read events, never the runtime.

Every name below is imported when first used (PEP 562), so that importing one module
of the package (``projections.dialect``) does not import every read model.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aggregates.lazy_names import lazy_names

if TYPE_CHECKING:
    from projections.dialect import Dialect as Dialect
    from projections.effects import OpenEffectsProjection as OpenEffectsProjection
    from projections.effects import list_open_effects as list_open_effects
    from projections.metrics import MetricsProjection as MetricsProjection
    from projections.metrics import MetricsRow as MetricsRow
    from projections.metrics import metrics as metrics
    from projections.plans import PlannedWriteView as PlannedWriteView
    from projections.plans import PlanView as PlanView
    from projections.plans import WriteMade as WriteMade
    from projections.plans import plans_against_done as plans_against_done
    from projections.runner import CatchUpReport as CatchUpReport
    from projections.runner import ForeignReadModelsError as ForeignReadModelsError
    from projections.runner import Projection as Projection
    from projections.runner import ProjectionError as ProjectionError
    from projections.runner import ProjectionRunner as ProjectionRunner
    from projections.runner import ProjectionStatus as ProjectionStatus
    from projections.runner import ReadModel as ReadModel
    from projections.runner import ReadModelRunner as ReadModelRunner
    from projections.runner import SkippedRow as SkippedRow
    from projections.sql import ViewCursor as ViewCursor
    from projections.trajectory import CallView as CallView
    from projections.trajectory import CritiqueView as CritiqueView
    from projections.trajectory import InvocationStatus as InvocationStatus
    from projections.trajectory import StepView as StepView
    from projections.trajectory import Trajectory as Trajectory
    from projections.trajectory import TrajectoryProjection as TrajectoryProjection
    from projections.trajectory import build_trajectory as build_trajectory
    from projections.trajectory import evolve_trajectory as evolve_trajectory
    from projections.trajectory import invocation_summary as invocation_summary
    from projections.trajectory import list_invocations as list_invocations
    from projections.trajectory import load_trajectory as load_trajectory

_EXPORTS: dict[str, str] = {
    "Dialect": "projections.dialect",
    "OpenEffectsProjection": "projections.effects",
    "list_open_effects": "projections.effects",
    "MetricsProjection": "projections.metrics",
    "MetricsRow": "projections.metrics",
    "metrics": "projections.metrics",
    "PlanView": "projections.plans",
    "PlannedWriteView": "projections.plans",
    "WriteMade": "projections.plans",
    "plans_against_done": "projections.plans",
    "CatchUpReport": "projections.runner",
    "ForeignReadModelsError": "projections.runner",
    "Projection": "projections.runner",
    "ProjectionError": "projections.runner",
    "ProjectionRunner": "projections.runner",
    "ProjectionStatus": "projections.runner",
    "ReadModel": "projections.runner",
    "ReadModelRunner": "projections.runner",
    "SkippedRow": "projections.runner",
    "ViewCursor": "projections.sql",
    "CallView": "projections.trajectory",
    "CritiqueView": "projections.trajectory",
    "InvocationStatus": "projections.trajectory",
    "StepView": "projections.trajectory",
    "Trajectory": "projections.trajectory",
    "TrajectoryProjection": "projections.trajectory",
    "build_trajectory": "projections.trajectory",
    "evolve_trajectory": "projections.trajectory",
    "invocation_summary": "projections.trajectory",
    "list_invocations": "projections.trajectory",
    "load_trajectory": "projections.trajectory",
}
"""Each public name and the module it is defined in (under the same name)."""

__all__ = [
    "CallView",
    "CatchUpReport",
    "CritiqueView",
    "Dialect",
    "ForeignReadModelsError",
    "InvocationStatus",
    "MetricsProjection",
    "MetricsRow",
    "OpenEffectsProjection",
    "PlanView",
    "PlannedWriteView",
    "Projection",
    "ProjectionError",
    "ProjectionRunner",
    "ProjectionStatus",
    "ReadModel",
    "ReadModelRunner",
    "SkippedRow",
    "StepView",
    "Trajectory",
    "TrajectoryProjection",
    "ViewCursor",
    "WriteMade",
    "build_trajectory",
    "default_projections",
    "evolve_trajectory",
    "invocation_summary",
    "list_invocations",
    "list_open_effects",
    "load_trajectory",
    "metrics",
    "plans_against_done",
]


def default_projections() -> list[ReadModel]:
    """The read models loop-actors maintains: trajectory, metrics and open effects."""
    from projections.effects import OpenEffectsProjection  # noqa: PLC0415 - see the docstring
    from projections.metrics import MetricsProjection  # noqa: PLC0415
    from projections.trajectory import TrajectoryProjection  # noqa: PLC0415

    return [TrajectoryProjection(), MetricsProjection(), OpenEffectsProjection()]


__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)


class _Package(types.ModuleType):
    """The package's module type, for the one public name that is also a module's name.

    The function ``metrics`` is defined in the module ``projections.metrics``: importing
    that module binds the package's attribute ``metrics`` to the module, and a module's
    ``__getattr__`` is not asked for a name already bound. This property keeps the name
    for the function, imported with its module when first used (a reading command that
    imports ``projections.dialect`` imports no read model: issue 32).
    """

    @property
    def metrics(self) -> Callable[..., Any]:
        """The function :func:`projections.metrics.metrics`."""
        from projections.metrics import metrics  # noqa: PLC0415 - see the class docstring

        return metrics

    @metrics.setter
    def metrics(self, _module: object) -> None:
        """What the import system binds when ``projections.metrics`` is imported: ignored."""


sys.modules[__name__].__class__ = _Package
