"""The vLLM ``KVCacheManager`` driver of the differential and live tests; it lives in the package
(:mod:`prefixshield.validate.kvdriver`) so that ``prefixshield bench`` can use it too."""

from prefixshield.validate.kvdriver import CONTRACTS, SALTS, Side, run_stream  # noqa: F401
