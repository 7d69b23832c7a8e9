"""``python -m parity`` is the ``parity`` command."""

from parity.cli import main

raise SystemExit(main())
