"""The read-model classes' new names, and their old names still importable as the same objects."""

from __future__ import annotations

import projections
import projections.runner
from projections import (
    MetricsProjection,
    OpenEffectsProjection,
    Projection,
    ProjectionRunner,
    ReadModel,
    ReadModelRunner,
    TrajectoryProjection,
)


def test_the_old_names_are_the_same_classes_as_the_new_ones() -> None:
    assert Projection is ReadModel
    assert ProjectionRunner is ReadModelRunner
    assert projections.runner.Projection is ReadModel
    assert projections.runner.ProjectionRunner is ReadModelRunner


def test_the_new_names_do_not_collide_with_eventsourcings_projection_classes() -> None:
    from eventsourcing import projection as eventsourcing_projection

    for name in ("Projection", "ProjectionRunner"):
        assert getattr(eventsourcing_projection, name) is not getattr(projections, name)
    assert ReadModel.__name__ == "ReadModel"
    assert ReadModelRunner.__name__ == "ReadModelRunner"


def test_every_default_read_model_is_a_read_model() -> None:
    for model in projections.default_projections():
        assert isinstance(model, ReadModel)
    assert {type(m) for m in projections.default_projections()} == {
        TrajectoryProjection,
        MetricsProjection,
        OpenEffectsProjection,
    }
