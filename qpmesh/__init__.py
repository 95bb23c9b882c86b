"""The ``qpmesh`` command: the one composition root.

`qpmesh.cli` is the only module allowed to import every other package (it registers each
component's subcommands); nothing imports `qpmesh` back. See docs/architecture.md,
"Rule of dependency".
"""
