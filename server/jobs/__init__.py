"""Compare jobs: the ``JobQueue`` protocol, the local process pool, Celery, and ``TaskRunner`` (one rank)."""
