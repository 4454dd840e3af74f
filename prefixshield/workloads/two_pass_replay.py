"""``two_pass_replay``: the attacker admits prefixes, then replays them (manufactured reuse)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixshield.traces.rows import RequestRows
from prefixshield.traces.schema import Trace
from prefixshield.workloads.attack import (GI_ATTACKER, AttackParams, attack_meta, finish_attack,
                                           population_defaults, victim_and_window)
from prefixshield.workloads.base import (STREAM_ATTACKER, add_fresh_prefixes, check,
                                         periodic_times, rng_for)
from prefixshield.workloads.registry import register


@dataclass(frozen=True)
class TwoPassReplayParams(AttackParams):
    """``two_pass_replay``: per round, K fresh prefixes, then ``replays`` passes replaying them
    while the debt of the first pass is outstanding (reference: "the attacker admits a set of
    prefixes, then replays them").

    The replay makes the attacker's blocks look reused, which is what reuse-aware retention
    (S3-FIFO's frequency, PrefixShield's REUSE class) rewards; the attack stresses that, not
    the cache's size, so it is not a flood.

    Attributes:
        pressure_ratio: creation pressure of the whole pattern (fresh and replayed requests'
            new blocks) over the attacker's refill (None: the population's). Fitted (the
            reference does not state the rate) to the reference's LRU victim hit ratio under
            this attack, 92.87%: 0.75 under ``background`` (91.42% here over 10 seeds), 4.5
            under ``two_group`` (91.83%; docs/fidelity.md). ``duration_s`` keeps the base
            default of 60 s (not stated, not fitted: no observation constrains it).
        replay_set: K, prefixes per round; default 1: each prefix is replayed right after it
            was admitted (``1 / rate`` later, about when its first request finishes decoding),
            so the replay finds it cached under any policy and the reuse it manufactures is
            real reuse to the cache. A larger K spaces admission and replay K requests apart;
            at the default pressure the replays of a large set miss (a 9-prefix set at 4,096
            blocks is replayed 28 s after its admission, when it has been evicted).
        replays: replay passes per round after the first (admitting) pass.
        rounds: rounds of (K fresh + ``replays`` x K replays); None: as many as the pressure
            window holds. Requests go out evenly spaced at the attacker rate.
    """

    POPULATION_DEFAULTS = population_defaults(
        AttackParams.POPULATION_DEFAULTS,
        background={"pressure_ratio": 0.75}, two_group={"pressure_ratio": 4.5})

    pressure_ratio: float | None = None
    replay_set: int = 1
    replays: int = 1
    rounds: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.replay_set >= 1, f"replay_set must be >= 1, got {self.replay_set}")
        check(self.replays >= 1, f"replays must be >= 1, got {self.replays}")
        check(self.rounds is None or self.rounds >= 1, f"rounds must be >= 1, got {self.rounds}")

    def attacker_blocks_per_request(self) -> float:
        """Mean blocks per attacker request over a round: one fresh request per ``1 + replays``,
        the replays creating only the blocks beyond their cached prompt."""
        fresh = self.expected_request_blocks()
        replay = self.expected_request_blocks(replay=True)
        return (fresh + self.replays * replay) / (1 + self.replays)


@register("two_pass_replay", TwoPassReplayParams)
def two_pass_replay(params: TwoPassReplayParams | None = None) -> Trace:
    """Two-pass replay: per round, K fresh prefixes then ``replays`` passes replaying them.

    Attacker requests go out evenly spaced at the attacker rate through the window: round r
    sends prefixes ``r*K .. r*K+K-1`` fresh, then the same prefixes again (identical segments
    and prefix_ids, so the replays hit the cache if the prefixes are still there). Victim stream
    as in ``one_touch``.
    """
    p = params or TwoPassReplayParams()
    rows = RequestRows()
    victim, w0, w1 = victim_and_window(p, rows)
    rate = p.attacker_request_rate()
    k = p.replay_set
    per_round = k * (1 + p.replays)
    limit = None if p.rounds is None else p.rounds * per_round
    t = periodic_times(rate, w0, w1, limit=limit)
    slot = np.arange(len(t))
    rnd, pos = slot // per_round, slot % per_round
    local = rnd * k + pos % k
    add_fresh_prefixes(rows, p, rng_for(p.seed, STREAM_ATTACKER), t, local,
                       group_index=GI_ATTACKER, group=p.attacker_group,
                       contract=p.attacker_contract, role="attacker")
    meta = attack_meta("two_pass_replay", p, victim, rate, (w0, w1), attacker_requests=len(t),
                       replay_set=k, attacker_replay_requests=int(np.sum(pos >= k)))
    return finish_attack(rows, p, meta)
