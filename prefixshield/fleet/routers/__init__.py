"""Routers: the registry (`prefixshield.fleet.routers.base.ROUTERS`) and one module per
router."""
