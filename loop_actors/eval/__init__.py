"""Evaluation: suites of cases run as invocations, scored from their events, reported."""
