"""Give freed memory back to the operating system between document batches (glibc only; a no-op elsewhere).

An ingest frees each batch's tables, vectors and LanceDB's working buffers when the batch is written, but glibc's
allocator keeps freed pages in per-thread arenas (up to 8 per core), so the resident set ratchets up to the
largest moment of every thread rather than of the run. ``trim`` after each batch hands the freed pages back, and
``limit_arenas`` keeps the process to two arenas (``MALLOC_ARENA_MAX=2``); Dask's workers trim for the same reason.

Arrow's own jemalloc pool keeps freed buffers out of glibc's reach, so kbflow's processes allocate Arrow
buffers from the C allocator (``ARROW_DEFAULT_MEMORY_POOL=system``, kbflow.runtime.environment). What each of these saves,
measured, is in docs/reliability.md (the memory of a long ingest).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
_libc = None


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt"):
                    _libc = libc
            except OSError:
                pass
    return _libc


def limit_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for threads created from now on; True when applied."""
    libc = _glibc()
    return bool(libc and libc.mallopt(M_ARENA_MAX, arenas))


def trim() -> bool:
    """Return free heap pages to the OS; True when some memory was released."""
    libc = _glibc()
    return bool(libc and libc.malloc_trim(0))
