"""prefixshield: a vLLM-faithful prefix-cache simulator for multi-tenant replacement policies."""

__version__ = "0.1.0"
