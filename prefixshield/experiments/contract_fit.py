"""Contracts sized to the deployment: fit each tier's refill and burst to a trace and a pool, and
say when the contracts in force do not fit.

The reference's contracts (64/40/16 blocks/s, bursts 256/192/128 blocks) were sized for a pool
of 511 usable blocks on an L4. On a pool a hundred times larger, fed by a real trace, every
tenant creates far more than that per second, so every tenant is in debt all the time and
PrefixShield's responsibility signal (who is *more* in debt) says nothing about who causes the
pressure. `fit_contracts` derives contracts from what the trace's groups create under
LRU (never from a PrefixShield run):

* ``r_{g,c}``: blocks group g materialized under contract c per second of the measured window,
  in an LRU run of the trace on the pool (``created / window``);
* a tier's refill is the mean rate of the groups on it: ``rho_c = mean_{g on c} r_{g,c}``, so
  together the contracts fund exactly what the groups created under LRU, and a group that
  creates more than its tier's mean is the one that goes into debt;
* the pool's turnover time ``T = U / sum_{g,c} r_{g,c}`` (seconds for the trace's creation to
  rewrite the ``U`` usable blocks once); a tier's burst is what its refill earns in one
  turnover: ``beta_c = rho_c * T``, so each group's bucket holds its share of the pool and the
  buckets of all groups together hold one pool;
* a tier no group of the trace uses (or whose groups created nothing) keeps its reference
  refill scaled like the fitted ones: ``rho_c = k * rho_c^ref`` with
  ``k = sum_fitted |G_c| rho_c / sum_fitted |G_c| rho_c^ref``, and ``beta_c = rho_c * T``.

`debt_warning` is the run-time guard: when every group is in debt for most of the
measured window (`MOST`), the contracts do not fit the deployment; when one tenant that
is not an attacker is, creating at least `FAR` times its refill, its contract does not
fit that tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from prefixshield.simulator.creation import debt_fraction
from prefixshield.simulator.engine import RunResult
from prefixshield.simulator.metrics import measured_window
from prefixshield.tenancy import DEFAULT_CONTRACTS, Contract

MOST = 0.5
"""The guard fires when every group, or one tenant that is not an attacker, is in debt for
more than this fraction of the window."""
FAR = 2.0
"""...and, for one tenant, when it also created at least this many times its refill (a tenant
somewhat above its tier's mean is in debt by design under fitted contracts)."""


@dataclass(frozen=True)
class ContractFit:
    """Contracts fitted to a trace and a pool, with the measurements they come from.

    Attributes:
        contracts: the fitted table (every reference tier, and every tier the trace uses).
        rates: blocks/s that each ``(group, contract)`` materialized in the LRU run's window.
        window_s: the measured window ``(start, end)`` in seconds.
        usable_blocks: ``U``, the pool's usable blocks (configured blocks minus the null one).
        turnover_s: ``T = U / sum(rates)``, seconds per pool turnover.
        scale: ``k``, fitted over reference refill (used for tiers without a measured rate).
        fitted: the tiers whose refill is a measured mean (the others are scaled).
    """

    contracts: Mapping[str, Contract]
    rates: Mapping[tuple[str, str], float]
    window_s: tuple[float, float]
    usable_blocks: int
    turnover_s: float
    scale: float
    fitted: tuple[str, ...]

    def describe(self) -> list[str]:
        """Lines for the console: the measurement, then each tier's fitted contract."""
        w0, w1 = self.window_s
        rates = ", ".join(f"{g} ({c}) {r:,.1f}" for (g, c), r in self.rates.items())
        out = [f"contracts fitted under LRU over the measured window {w0:,.1f}-{w1:,.1f} s: "
               f"creation {rates} blocks/s; {self.usable_blocks:,} usable blocks turn over "
               f"every {self.turnover_s:,.2f} s"]
        for name, c in self.contracts.items():
            how = "mean of its groups" if name in self.fitted else f"reference x {self.scale:.3g}"
            out.append(f"  {name}: refill {c.rho_blocks_per_s:,.2f} blocks/s ({how}), burst "
                       f"{c.beta_blocks:,.1f} blocks (refill x turnover)")
        out.append("  in a sweep spec: " + ", ".join(
            f"contract.{n}.rho = {c.rho_blocks_per_s:.6g}, contract.{n}.beta = "
            f"{c.beta_blocks:.6g}" for n, c in self.contracts.items()))
        return out

    def to_dict(self) -> dict:
        """JSON-ready record of the fit (written into a run's ``config.json``)."""
        return {"rates_blocks_per_s": [{"group": g, "contract": c, "rate": r}
                                       for (g, c), r in self.rates.items()],
                "window_s": list(self.window_s), "usable_blocks": self.usable_blocks,
                "turnover_s": self.turnover_s, "scale": self.scale,
                "fitted": list(self.fitted),
                "contracts": {n: {"rho_blocks_per_s": c.rho_blocks_per_s,
                                  "beta_blocks": c.beta_blocks}
                              for n, c in self.contracts.items()}}


def creation_rates(result: RunResult) -> dict[tuple[str, str], float]:
    """Blocks/s each ``(group, contract)`` of the trace materialized over the run's measured
    window (0.0 for a pair that created nothing in it), in the order the trace names them.

    Raises:
        ValueError: when the measured window is empty (one measured arrival instant).
    """
    w0, w1 = measured_window(result)
    if not w1 > w0:
        raise ValueError("--contracts fit: the measured window is empty (all measured requests "
                         "arrive at one instant); no creation rate can be measured")
    log = result.creations
    inside = (log["t_s"] >= w0) & (log["t_s"] < w1)
    made = np.zeros((len(result.groups), len(result.contracts)))
    np.add.at(made, (log["group"][inside], log["contract"][inside]), log["blocks"][inside])
    pairs = result.records[["group", "contract"]].drop_duplicates()
    gi = {g: i for i, g in enumerate(result.groups)}
    ci = {c: i for i, c in enumerate(result.contracts)}
    return {(str(g), str(c)): float(made[gi[g], ci[c]] / (w1 - w0))
            for g, c in pairs.itertuples(index=False)}


def fit_contracts(lru: RunResult, num_blocks: int,
                  reference: Mapping[str, Contract] = DEFAULT_CONTRACTS) -> ContractFit:
    """Contracts for the trace and pool of an LRU run (the formulas: see the module docstring).

    Args:
        lru: a run of the trace under LRU on the pool the contracts are for.
        num_blocks: the pool's configured blocks (``U = num_blocks - 1``).
        reference: the table whose tier ratios scale the tiers without a measured rate; it
            must name every contract the trace uses.

    Raises:
        ValueError: when no block was created in the measured window, or a contract of the
            trace is not in ``reference``.
    """
    rates = creation_rates(lru)
    total = sum(rates.values())
    if not total > 0:
        raise ValueError("--contracts fit: no block was created in the measured window under "
                         "LRU; there is no creation to size contracts to")
    usable = int(num_blocks) - 1
    turnover = usable / total
    per_tier: dict[str, list[float]] = {}
    for (_g, c), r in rates.items():
        if c not in reference:
            raise ValueError(f"--contracts fit: the trace's contract {c!r} is not one of "
                             f"{', '.join(reference)}")
        per_tier.setdefault(c, []).append(r)
    rho = {c: float(np.mean(rs)) for c, rs in per_tier.items() if np.mean(rs) > 0}
    n_groups = {c: len(rs) for c, rs in per_tier.items()}
    scale = (sum(n_groups[c] * rho[c] for c in rho)
             / sum(n_groups[c] * reference[c].rho_blocks_per_s for c in rho))
    table = {}
    for name in dict.fromkeys([*reference, *per_tier]):
        r = rho.get(name, scale * reference[name].rho_blocks_per_s)
        table[name] = replace(reference[name], rho_blocks_per_s=r, beta_blocks=r * turnover)
    return ContractFit(contracts=table, rates=rates, window_s=measured_window(lru),
                       usable_blocks=usable, turnover_s=turnover, scale=scale,
                       fitted=tuple(rho))


def debt_fractions(result: RunResult) -> dict[str, float]:
    """Per group of the run, the fraction of the measured window it was in debt under the
    run's contracts (`debt_fraction`)."""
    window = measured_window(result)
    return {g: debt_fraction(result.creations, i, result.contract_rho, result.contract_beta,
                             window) for i, g in enumerate(result.groups)}


def debt_warning(results: Mapping[str, RunResult], fitted: bool = False) -> str | None:
    """The guard: None when the contracts fit, else one message (``fitted``: the contracts
    were fitted to this trace and pool, `fit_contracts`, so the message does not advise
    fitting them again).

    * When every group was in debt for more than `MOST` of the measured window in some
      run, the contracts do not fit the deployment: the message names those runs, the
      contracts' refill and the creation rates measured in the first such run (LRU's when it
      is among them).
    * Otherwise, when some tenant that is not an attacker (role ``victim`` or ``benign``) was
      in debt for more than `MOST` of the window and created at least `FAR` times
      its refill, its contract does not fit it: the message names each such tenant with its
      creation rate, its refill and their ratio, in the first such run (LRU's when it is
      among them). An attacker is in debt by design and is never named.
    """
    fired, partial = {}, {}
    for label, r in results.items():
        frac = debt_fractions(r)
        if frac and all(f > MOST for f in frac.values()):
            fired[label] = min(frac.values())
            continue
        roles = dict(zip(r.records["group"].astype(str), r.records["role"].astype(str)))
        over = {g: f for g, f in frac.items() if f > MOST and roles.get(g, "") != "attacker"}
        if over:
            far = _far_over(r, over)
            if far:
                partial[label] = far
    if fired:
        first = "lru" if "lru" in fired else next(iter(fired))
        r = results[first]
        used = dict.fromkeys(str(c) for c in r.records["contract"])
        refill = ", ".join(f"{c} {r.contract_rho[r.contracts.index(c)]:g} blocks/s (burst "
                           f"{r.contract_beta[r.contracts.index(c)]:g})" for c in used)
        made = ", ".join(f"{g} {x:,.1f}" for (g, _c), x in creation_rates(r).items())
        runs = ", ".join(f"{p} (least {100 * f:.0f}%)" for p, f in fired.items())
        return (f"the contracts do not fit this deployment: every group was in debt for most "
                f"of the measured window under {runs}. Refill: {refill}; measured creation "
                f"under {first}: {made} blocks/s. "
                + ("They were fitted to this trace and pool (--contracts fit): their refills "
                   "fund, on average, what the groups created under LRU." if fitted else
                   "Size the contracts to this trace and pool with --contracts fit."))
    if not partial:
        return None
    first = "lru" if "lru" in partial else next(iter(partial))
    r = results[first]
    rates = creation_rates(r)
    parts = []
    for g, f in partial[first].items():
        for (gg, c), x in rates.items():
            if gg != g:
                continue
            rho = r.contract_rho[r.contracts.index(c)]
            ratio = f", {x / rho:.1f}x its refill" if rho > 0 else ""
            parts.append(f"{g} ({c}: refill {rho:g} blocks/s) created {x:,.1f} blocks/s"
                         f"{ratio}, in debt {100 * f:.0f}% of the window")
    return (f"a tenant's contract does not fit it under {first}: " + "; ".join(parts)
            + f" (under {', '.join(partial)}). PrefixShield evicts an indebted tenant's "
            "blocks first, as it would an attacker's; "
            + ("the contracts were fitted to this trace and pool (--contracts fit), a tier's "
               "refill its groups' mean creation, so a tenant far above its tier's mean is in "
               "debt by construction: give it a larger tier." if fitted else
               "size the contracts to this trace and pool with --contracts fit, or give the "
               "tenant a larger tier."))


def _far_over(result: RunResult, groups: Mapping[str, float]) -> dict[str, float]:
    """Those of ``groups`` (group -> debt fraction) that created at least `FAR` times
    the refill of one of their contracts in ``result``'s measured window."""
    keep = {}
    for (g, c), x in creation_rates(result).items():
        rho = result.contract_rho[result.contracts.index(c)]
        if g in groups and (rho <= 0 or x >= FAR * rho):
            keep[g] = groups[g]
    return keep


def fit_to_trace(trace, spec) -> ContractFit:
    """Run ``trace`` under LRU on ``spec``'s engine and profile, and fit contracts to it
    (`fit_contracts`, reference tiers from ``spec.contract_table``).

    Raises:
        ValueError: naming ``--contracts fit`` when LRU cannot serve the trace on this pool.
    """
    from prefixshield.experiments.single import run_policies
    from prefixshield.simulator.engine import EngineError

    try:
        lru = run_policies(trace, replace(spec, policies=("lru",)))["lru"]
    except EngineError as e:
        raise ValueError(f"--contracts fit: LRU cannot serve this trace on this pool ({e})") \
            from None
    return fit_contracts(lru, spec.engine.num_blocks, spec.contract_table)
