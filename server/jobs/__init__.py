"""Jobs: the backends (local process pool, Celery) and ``TaskRunner``, which claims a job and runs it."""
