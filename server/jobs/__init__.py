"""Compare jobs: the ``JobQueue`` protocol, the local process pool, and ``run_compare_job``."""
