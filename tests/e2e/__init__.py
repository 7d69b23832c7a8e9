"""End-to-end tests: the client against a real ``parity server`` (and against an in-memory fake)."""
