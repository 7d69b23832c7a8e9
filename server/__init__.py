"""The Parity server: runs and their dump files over REST, compare jobs in a worker pool, reports.

``parity.server.main.create_app(settings)`` builds the FastAPI app; nothing is built at import time.
Layout: ``api/`` (thin routes, dependencies), ``services/`` (the logic, raising ``errors.ServiceError``),
``repositories.py`` (queries), ``models.py`` + ``migrations/`` (one Alembic tree for SQLite and PostgreSQL),
``store.py`` (file:// and s3:// blob stores), ``jobs/`` (the ``JobQueue`` protocol, the local process pool,
Celery, ``TaskRunner``: one rank of a comparison).
"""
