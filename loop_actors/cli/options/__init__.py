"""The options of each command group: one module per group of ``loop_actors.cli``.

``loop_actors.cli.options.<group>`` adds the options of the commands that
``loop_actors.cli.<group>`` runs. These modules import neither trio nor
eventsourcing nor pydantic, so that ``loop-actors <command> --help`` (and a
usage error) stays as quick as ``--version``: a command's defaults and choices
are written here as literals, and a test checks that they agree with the
runtime's (``tests/cli/test_cli_startup.py``).
"""
