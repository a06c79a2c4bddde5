"""Read models built from the event stream: they read events, never the runtime."""

from projections.dialect import Dialect as Dialect
from projections.effects import OpenEffectsProjection as OpenEffectsProjection
from projections.effects import list_open_effects as list_open_effects
from projections.metrics import MetricsProjection as MetricsProjection
from projections.metrics import MetricsRow as MetricsRow
from projections.metrics import metrics as metrics
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
from projections.trajectory import InvocationStatus as InvocationStatus
from projections.trajectory import StepView as StepView
from projections.trajectory import Trajectory as Trajectory
from projections.trajectory import TrajectoryProjection as TrajectoryProjection
from projections.trajectory import build_trajectory as build_trajectory
from projections.trajectory import evolve_trajectory as evolve_trajectory
from projections.trajectory import list_invocations as list_invocations
from projections.trajectory import load_trajectory as load_trajectory


def default_projections() -> list[ReadModel]:
    """The read models loop-actors maintains: trajectory, metrics and open effects."""
    return [TrajectoryProjection(), MetricsProjection(), OpenEffectsProjection()]
