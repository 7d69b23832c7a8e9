"""Sub-commands of the ``parity`` command: each module has ``add_arguments(parser)`` and ``run(args)``."""
