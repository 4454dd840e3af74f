"""Replacement policies. Importing this package registers every policy in ``base.POLICIES``."""

from prefixshield.policies import lru  # noqa: F401
from prefixshield.policies import prefixshield as _prefixshield  # noqa: F401
from prefixshield.policies import s3fifo  # noqa: F401
from prefixshield.policies import static_quota  # noqa: F401
from prefixshield.policies.base import COMPAT_MODES, POLICIES, Policy, make_policy, register_policy

__all__ = ["COMPAT_MODES", "POLICIES", "Policy", "make_policy", "register_policy"]
