"""Segment-id namespaces: distinct content gets distinct ids, by construction.

A prompt is a list of segments; a segment's token ids are a pure function of the trace seed and
the segment id (`prefixshield.traces.tokens`). Two segments with the same id therefore have
the same content (a shorter one is a prefix of a longer one). Generators and importers draw ids
from disjoint ranges, one per ``(group index, kind)``::

    segment_id = ((group_index * NUM_KINDS + kind) << LOCAL_BITS) | local

so a prefix of group A never equals one of group B, a generated (assistant) segment never equals
a user segment, and adding or removing one group's rows (the attacker of an attack trace) leaves
every other group's ids unchanged.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

LOCAL_BITS = 40
"""Bits of the per-namespace counter: 2**40 segments per (group, kind)."""

NUM_KINDS = 8
"""Kinds reserved per group (4 used, the rest spare)."""

MAX_GROUP_INDEX = (1 << (63 - LOCAL_BITS)) // NUM_KINDS - 1
"""Largest group index whose ids still fit a non-negative int64."""


class SegmentKind(IntEnum):
    """What a segment holds; each kind has its own id range within a group."""

    PREFIX = 0
    """A shared prefix (hot prefix, attacker prefix, cyclic working-set prefix)."""
    SUFFIX = 1
    """A unique prompt part: a question suffix, a user message, an imported prompt body."""
    OUTPUT = 2
    """Tokens a request generates (an assistant message), replayed as later history."""
    SYSTEM = 3
    """A system prompt shared within a group."""


def segment_base(group_index: int, kind: SegmentKind) -> int:
    """First segment id of the ``(group_index, kind)`` namespace (add a local id < 2**40)."""
    if not 0 <= group_index <= MAX_GROUP_INDEX:
        raise ValueError(f"group_index must be in [0, {MAX_GROUP_INDEX}], got {group_index}")
    return (int(group_index) * NUM_KINDS + int(kind)) << LOCAL_BITS


def segment_ids(group_index: int, kind: SegmentKind, local) -> np.ndarray:
    """Segment ids (int64) for local ids ``local`` (ints in ``[0, 2**40)``) of a namespace."""
    loc = np.asarray(local, dtype=np.int64)
    if loc.size and (loc.min() < 0 or loc.max() >= (1 << LOCAL_BITS)):
        raise ValueError(f"local segment ids must be in [0, 2**{LOCAL_BITS})")
    return np.int64(segment_base(group_index, kind)) + loc
