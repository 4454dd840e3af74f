"""Pure-Python reference implementations of the policies: the executable specification.

Short and readable (lists, deques, dicts, OrderedDict), same `Policy`
interface as the numba policies, and *not* registered: tests hold the fast policies to
these block for block under random operation sequences.
"""

from prefixshield.policies.reference.lru import ReferenceLRU
from prefixshield.policies.reference.prefixshield import ReferencePrefixShield
from prefixshield.policies.reference.s3fifo import ReferenceS3FIFO

__all__ = ["ReferenceLRU", "ReferencePrefixShield", "ReferenceS3FIFO"]
