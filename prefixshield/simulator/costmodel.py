"""Step time of one engine step from a hardware/model profile.

``t_step = a + b * prefill_tokens + c * decode_seqs + d * context_tokens + e * new_requests``
seconds, where ``prefill_tokens`` are the tokens computed by sequences still in prefill (chunked
or recomputed), ``decode_seqs`` the sequences decoding one token, ``context_tokens`` the KV tokens
attended by every scheduled sequence (cached and computed context plus the step's own tokens),
and ``new_requests`` the requests scheduled for the first time in the step. ``e`` is the engine
loop's per-request input processing, which an in-process (offline) vLLM pays serially
(``add_request``); it is 0 where a separate front-end process does that work. Profiles are TOML
files in ``simulator/profiles/`` carrying the coefficients and their provenance.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


class ProfileError(ValueError):
    """A profile is unknown or malformed; the message names the file and field."""


@dataclass(frozen=True)
class CostModel:
    """Linear step-time model; every coefficient in seconds per unit, all >= 0."""

    a_s: float
    b_s_per_prefill_token: float
    c_s_per_decode_seq: float
    d_s_per_context_token: float
    e_s_per_new_request: float = 0.0

    def step_time(self, prefill_tokens: int, decode_seqs: int, context_tokens: int,
                  new_requests: int = 0) -> float:
        """Seconds one step takes."""
        return (self.a_s + self.b_s_per_prefill_token * prefill_tokens
                + self.c_s_per_decode_seq * decode_seqs
                + self.d_s_per_context_token * context_tokens
                + self.e_s_per_new_request * new_requests)


@dataclass(frozen=True)
class Profile:
    """A named cost model with its provenance (GPU, model, vLLM version, how obtained)."""

    name: str
    cost: CostModel
    provenance: dict = field(default_factory=dict)
    source: str = ""


_COST_FIELDS = ("a_s", "b_s_per_prefill_token", "c_s_per_decode_seq", "d_s_per_context_token")
_OPTIONAL_COST_FIELDS = ("e_s_per_new_request",)
_PROVENANCE_FIELDS = ("status", "hardware", "model", "vllm_version", "attention_backend", "date",
                      "method")


def _profile_dir():
    return resources.files("prefixshield.simulator") / "profiles"


def list_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.name[:-5] for p in _profile_dir().iterdir() if p.name.endswith(".toml"))


MAX_COEFFICIENT_S = 10.0
"""Largest accepted cost coefficient (seconds, or seconds per token/sequence): a step of a real
engine takes milliseconds; anything near this bound is a unit mistake, not a GPU."""


def parse_profile(text: str, source: str) -> Profile:
    """Parse and validate profile TOML ``text``; errors name ``source`` and the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{source}: not valid TOML: {e}") from None
    for section in ("cost", "provenance"):
        if not isinstance(data.get(section), dict):
            raise ProfileError(f"{source}: missing table [{section}]")
    cost = data["cost"]
    values = {}
    for f in _COST_FIELDS + tuple(f for f in _OPTIONAL_COST_FIELDS if f in cost):
        v = cost.get(f)
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                or not 0 <= v <= MAX_COEFFICIENT_S):
            raise ProfileError(f"{source}: [cost].{f} must be a finite number in "
                               f"[0, {MAX_COEFFICIENT_S:g}] seconds, got {v!r}")
        values[f] = float(v)
    if values["a_s"] + values["c_s_per_decode_seq"] + values["d_s_per_context_token"] <= 0:
        raise ProfileError(f"{source}: [cost]: a one-sequence decode step would take no time "
                           "(a_s, c_s_per_decode_seq and d_s_per_context_token are all 0); "
                           "the simulated clock could not advance")
    unknown = sorted(set(cost) - set(_COST_FIELDS) - set(_OPTIONAL_COST_FIELDS))
    if unknown:
        raise ProfileError(f"{source}: [cost] has unknown field(s) {', '.join(unknown)}")
    prov = data["provenance"]
    for f in _PROVENANCE_FIELDS:
        if not isinstance(prov.get(f), str) or not prov[f]:
            raise ProfileError(f"{source}: [provenance].{f} must be a non-empty string")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{source}: field name must be a non-empty string")
    return Profile(name=name, cost=CostModel(**values), provenance=dict(prov), source=source)


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name, or a profile TOML file by path."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        try:
            text = p.read_text()
        except OSError as e:
            raise ProfileError(f"{p}: cannot read profile: {e.strerror}") from None
        return parse_profile(text, str(p))
    res = _profile_dir() / f"{name_or_path}.toml"
    if not res.is_file():
        raise ProfileError(f"unknown profile {name_or_path!r}; shipped: {', '.join(list_profiles())}"
                           " (or give a path to a .toml file)")
    return parse_profile(res.read_text(), f"profiles/{name_or_path}.toml")
