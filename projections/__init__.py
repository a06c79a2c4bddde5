"""Read models built from the event stream: they read events, never the runtime."""

from projections.trajectory import CallView as CallView
from projections.trajectory import StepView as StepView
from projections.trajectory import Trajectory as Trajectory
from projections.trajectory import build_trajectory as build_trajectory
from projections.trajectory import render_text as render_text
