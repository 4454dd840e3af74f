"""``servegen``: tenants that are real clients of a production model (ServeGen's per-client fits).

Each tenant is one client of ServeGen's ``language/m-large`` data (``traces/data/
servegen_m_large.json``, Apache-2.0; see its PROVENANCE entry): its arrivals follow that client's
published per-10-minute fits (rate, and a Gamma or Weibull inter-arrival distribution whose shape
sets the burstiness), and its prompt and output lengths its published per-6-hour length
distributions. So tenants differ the way real clients differ: in rate (the first client sends
more than the next three together), burstiness, prompt length and output length.

What the data does not have, and this workload lays on top (a stated model, not data): prefix
reuse. Every prompt of a tenant longer than ``system_prompt_tokens`` starts with that tenant's
system prompt of that many tokens, followed by a unique remainder; a shorter prompt is unique
(a segment has one length).
Sweep ``system_prompt_tokens`` to see how much the answer depends on it.

Load: the tenants' *relative* rates are the data's; the total is scaled to ``base_rate``
(``alpha x C_prefill``, as every workload). Requests longer than the pool are clipped to it
(input first), as vLLM refuses prompts beyond ``max_model_len``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prefixshield.traces.rows import FlatRows, RequestRows
from prefixshield.traces.schema import Trace
from prefixshield.traces.segments import SegmentKind, segment_ids
from prefixshield.traces.shipped import (busiest_hour_start, mean_rate, rate_shares,
                                         servegen_clients, windows)
from prefixshield.workloads.base import (PROBE_SEED, STREAM_CONVERSATIONS, STREAM_PROBE,
                                         WorkloadParams, check, rng_for)
from prefixshield.workloads.registry import params_to_dict, register


@dataclass(frozen=True)
class ServeGenParams(WorkloadParams):
    """``servegen``: one tenant per ServeGen client.

    Attributes:
        num_tenants: tenants, the shipped clients with the most requests first (4: as many as
            ``sharegpt``'s benign groups; at most 8 are shipped).
        start_s: second of the shipped day the trace starts at (None: the start of the busiest
            hour of these tenants together, from the data).
        system_prompt_tokens: tokens of each tenant's shared system prompt (512: not from data;
            ServeGen publishes no prefix structure; a modelling choice to sweep).
        warmup_s: seconds at the start that are not measured (5: not from data; long enough for
            each active tenant's first request to cache its system prompt).
        contract: every tenant's contract.
    """

    num_tenants: int = 4
    start_s: float | None = None
    system_prompt_tokens: int = 512
    warmup_s: float = 5.0
    contract: str = "standard"

    def __post_init__(self) -> None:
        super().__post_init__()
        n = len(servegen_clients())
        check(1 <= self.num_tenants <= n, f"num_tenants must be in [1, {n}], got "
                                          f"{self.num_tenants}")
        check(self.start_s is None or 0 <= self.start_s < 86400,
              f"start_s must be in [0, 86400) s, got {self.start_s}")
        check(self.system_prompt_tokens >= 0,
              f"system_prompt_tokens must be >= 0, got {self.system_prompt_tokens}")
        check(0 <= self.warmup_s < self.duration_s,
              f"warmup_s must be in [0, duration_s), got {self.warmup_s}")

    @property
    def tenants(self) -> tuple[dict, ...]:
        """The clients used, most requests first."""
        return servegen_clients()[:self.num_tenants]

    @property
    def start(self) -> float:
        """``start_s``, or the start of the tenants' busiest hour (10-minute windows, by the
        published rates)."""
        if self.start_s is not None:
            return float(self.start_s)
        return busiest_hour_start(self.tenants)

    @property
    def max_request_tokens(self) -> int:
        """Tokens a request may need at most: the pool's (prompt plus output)."""
        return self.usable_blocks * self.block_size

    def probe_shapes(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) lengths drawn from the tenants' length mixes at the start
        window, weighted by their rates there (fixed RNG: independent of ``seed``)."""
        rng = np.random.default_rng([PROBE_SEED, STREAM_PROBE])
        shares = self._shares()
        who = rng.choice(len(shares), size=n, p=shares)
        prompt = np.empty(n, dtype=np.int64)
        out = np.empty(n, dtype=np.int64)
        for k in range(n):
            prompt[k], out[k] = _draw_lengths(rng, self.tenants[who[k]], self.start, 1,
                                              self.max_request_tokens)
        return prompt, out

    def shape_summary(self) -> str:
        """E.g. ``4 ServeGen m-large clients (61, 143, 34, 78), 512-token system prompts``."""
        ids = ", ".join(str(c["client"]) for c in self.tenants)
        return (f"{self.num_tenants} ServeGen m-large clients ({ids}), "
                f"{self.system_prompt_tokens}-token system prompts")

    def _shares(self) -> np.ndarray:
        return rate_shares(self.tenants, self.start, self.duration_s)


def _lengths_at(client: dict, t: float) -> dict:
    """The 6-hour length window covering second ``t`` of the day."""
    lengths = [x for x in client["lengths"] if x["start_s"] <= t] or client["lengths"][:1]
    return lengths[-1]


def _inverse_cdf(rng: np.random.Generator, quantiles: list, n: int) -> np.ndarray:
    """``n`` draws from a distribution given by its 101 percentiles (linear between them)."""
    u = rng.uniform(0.0, 100.0, size=n)
    return np.rint(np.interp(u, np.linspace(0, 100, 101), quantiles)).astype(np.int64)


def _draw_lengths(rng, client: dict, t: float, n: int, max_tokens: int):
    """``n`` (prompt, output) lengths of ``client`` at second ``t``, clipped to ``max_tokens``
    together (input first); each at least one token."""
    lw = _lengths_at(client, t)
    prompt = np.maximum(_inverse_cdf(rng, lw["input_tokens"], n), 1)
    out = np.maximum(_inverse_cdf(rng, lw["output_tokens"], n), 1)
    out = np.minimum(out, max_tokens - 1)
    prompt = np.minimum(prompt, max_tokens - out)
    return (prompt[0], out[0]) if n == 1 else (prompt, out)


def _arrivals(rng: np.random.Generator, client: dict, start: float, end: float,
              scale: float) -> np.ndarray:
    """Arrival seconds (day time) of ``client`` in ``[start, end)``: per 10-minute window a
    renewal process with the window's published distribution (Gamma or Weibull shape), its gaps
    rescaled to the window's rate times ``scale``."""
    times = []
    for w, lo, hi in windows(client, start, end):
        rate = w["rate"] * scale
        mean_n = rate * (hi - lo)
        n = int(mean_n * 1.5 + 10 * math.sqrt(mean_n + 1) + 16)
        shape, sc = w["shape"], w["scale"]
        if w["dist"] == "Gamma":
            gaps = rng.gamma(shape, sc, size=n)
        elif w["dist"] == "Weibull":
            gaps = rng.weibull(shape, size=n) * sc
        else:
            raise ValueError(f"ServeGen client {client['client']}: unknown distribution "
                             f"{w['dist']!r}")
        gaps = gaps / gaps.mean() / rate  # the published shape, at the scaled rate
        t = lo + np.cumsum(gaps)
        times.append(t[t < hi])
    return np.concatenate(times) if times else np.empty(0)


@register("servegen", ServeGenParams)
def servegen(params: ServeGenParams | None = None) -> Trace:
    """Tenants that are ServeGen clients (see `ServeGenParams` and the module docstring).

    Arrival times are seconds from the trace start (day second ``start``); every tenant has
    role ``benign``; the first ``warmup_s`` seconds are unmeasured.
    """
    p = params or ServeGenParams()
    start, end = p.start, p.start + p.duration_s
    shares = p._shares()
    rows = RequestRows()
    published = sum(mean_rate(c, start, end) for c in p.tenants)
    scale = p.base_rate / published
    counts = {}
    for gi, client in enumerate(p.tenants):
        group = f"client{client['client']}"
        rows.declare(group, p.contract)
        rng = rng_for(p.seed, STREAM_CONVERSATIONS + 100 * (gi + 1))
        t = _arrivals(rng, client, start, end, scale)
        n = len(t)
        counts[group] = n
        if n == 0:
            continue
        prompt = np.empty(n, dtype=np.int64)
        out = np.empty(n, dtype=np.int64)
        for j, tj in enumerate(t):  # the length window of each request's time
            prompt[j], out[j] = _draw_lengths(rng, client, float(tj), 1, p.max_request_tokens)
        sys_seg = int(segment_ids(gi, SegmentKind.SYSTEM, [0])[0])
        uniq = segment_ids(gi, SegmentKind.SUFFIX, np.arange(n))
        s = p.system_prompt_tokens
        shared = (prompt > s) if s else np.zeros(n, dtype=bool)
        # [system, unique] where the prompt is longer than the system prompt, else [unique]:
        # both laid out flat, each row's segments at 2 * row (a gap left where no system one)
        ids2 = np.stack([np.full(n, sys_seg, dtype=np.int64), uniq], axis=1)
        lens2 = np.stack([np.full(n, s, dtype=np.int64), np.where(shared, prompt - s, prompt)],
                         axis=1)
        keep = np.ones((n, 2), dtype=bool)
        keep[:, 0] = shared
        per_row = 1 + shared.astype(np.int64)
        ids, lens = FlatRows(ids2[keep], per_row), FlatRows(lens2[keep], per_row)
        pid = np.where(shared, 0, 1 + np.arange(n)).astype(np.int64)
        rel = t - start
        rows.add(rel, group, p.contract, "benign", pid, rel >= p.warmup_s, out, ids, lens)
    meta = {"workload": "servegen", "params": params_to_dict(p), "start_day_s": start,
            "clients": [c["client"] for c in p.tenants],
            "rate_shares": dict(zip((f"client{c['client']}" for c in p.tenants),
                                    map(float, shares))),
            "rate_scale": scale, "requests": counts,
            "measure_start_s": float(p.warmup_s), "measure_end_s": float(p.duration_s)}
    return rows.finish(p.seed, p.vocab_size, meta)
