"""prefixshield: a vLLM-faithful prefix-cache simulator for multi-tenant replacement policies."""

from prefixshield import kernelcache as _kernelcache

__version__ = "0.1.0"

# before any kernel module is imported: numba picks a function's cache directory as it decorates
# it, and its own staleness check cannot see edits of the modules a kernel inlines or calls
_kernelcache.configure()
