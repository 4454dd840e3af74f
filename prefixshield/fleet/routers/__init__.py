"""Routers: the registry (:data:`prefixshield.fleet.routers.base.ROUTERS`) and one module per
router."""
