"""The HTTP layer: thin routes over the services."""
