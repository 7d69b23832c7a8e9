"""The compare engine: pairs two dumps' rows, computes the metrics, judges them and advises."""
