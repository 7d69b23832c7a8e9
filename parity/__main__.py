"""``python -m parity`` is the ``parity`` command."""

from parity.cli import console_main

raise SystemExit(console_main())
