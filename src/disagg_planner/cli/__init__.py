"""The ``planner`` command line: one module per sub-command, registered in ``main.COMMANDS``."""
