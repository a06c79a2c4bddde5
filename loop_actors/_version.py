"""The version of loop-actors: the one place it is written (pyproject.toml reads it here).

A literal, so that ``loop-actors --version`` need not ask ``importlib.metadata`` (which
reads every installed distribution's metadata: about 30 ms).
"""

__version__ = "0.2.0"
