"""``PrecisionDebugger(..., plan=COMPARISON_ID)``: the next dump's plan, fetched from the server that holds
the comparison (``GET /comparisons/{id}/plan``, :mod:`parity.shared.plan`) and applied to the config.

Fetched once, at construction, before any hook is installed: a plan that cannot be had (no server, an
unknown comparison, one still running, one without suspects) is an error there, not an empty dump later.
"""

from __future__ import annotations

from parity.client.config import DebuggerConfig, apply_plan
from parity.client.errors import ClientError, ConfigError

__all__ = ["fetch_plan"]


def fetch_plan(cfg: DebuggerConfig) -> DebuggerConfig:
    """``cfg`` with the plan of comparison ``cfg.plan`` applied (``config.apply_plan``)."""
    comparison = cfg.plan
    assert comparison is not None
    if not cfg.server:
        raise ConfigError("plan", f"fetching the plan of comparison {comparison} needs 'server' "
                          "(or PARITY_SERVER)")  # fmt: skip
    from parity.client.rest import ParityClient

    try:
        with ParityClient(cfg.server, token=cfg.token) as api:
            plan = api.get_plan(comparison)
    except ClientError as exc:
        raise ConfigError("plan", f"could not fetch the plan of comparison {comparison}: {exc}") from None
    if plan.config is None:
        why = "; ".join(plan.notes) or "it has no suspects"
        raise ConfigError("plan", f"comparison {comparison} plans no dump: {why}")
    return apply_plan(cfg, plan.config, comparison)
