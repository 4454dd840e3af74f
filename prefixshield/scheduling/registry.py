"""The one list of schedulers: name -> the module whose class registers itself."""

from __future__ import annotations

from prefixshield.lazyregistry import LazyRegistry

SCHEDULER_MODULES: dict[str, str] = {
    "fcfs": "prefixshield.scheduling.fcfs",
    "priority": "prefixshield.scheduling.priority",
    "vtc": "prefixshield.scheduling.vtc",
    "kvtc": "prefixshield.scheduling.kvtc",
}
"""Name -> module; a module is imported the first time its scheduler is looked up."""

SCHEDULERS = LazyRegistry("scheduler", SCHEDULER_MODULES, group="prefixshield.schedulers")
"""The registry: scheduler name -> class (a [`Scheduler`][prefixshield.scheduling.base.Scheduler]
subclass). Other installed packages add schedulers in the entry-point group
``prefixshield.schedulers``."""


def register_scheduler(cls):
    """Class decorator: add ``cls`` to `SCHEDULERS` under ``cls.name``."""
    SCHEDULERS.register(cls.name, cls)
    return cls


def make_scheduler(config, groups, arrival_s, group_id):
    """Build ``config.name``'s scheduler for a run over ``groups``; a priority or limit naming
    a group not in ``groups`` raises ``ValueError``."""
    return SCHEDULERS[config.name](config, groups, arrival_s, group_id)
