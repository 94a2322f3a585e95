"""kbflow.runtime.memory: malloc arenas and trimming (what keeps an ingest's resident set from ratcheting up)."""

import json
import subprocess
import sys

import pytest

from kbflow.runtime import memory

# Run in a fresh interpreter, so the heap holds only what this script puts there. 2,000 blocks of 64 KiB (under
# glibc's 128 KiB mmap threshold, so they come from the heap, not from mmap) are written to (resident), then freed
# while one more block allocated after them stays alive: the freed 125 MiB now lie below a live block, where
# free() alone never hands pages back (it only shrinks the heap's top). Only malloc_trim returns them to the OS.
TRIM_PROBE = r"""
import ctypes, ctypes.util, json, os
from kbflow.runtime import memory

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]


def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


size = 64 * 1024
blocks = [libc.malloc(size) for _ in range(2000)]
for block in blocks:
    ctypes.memset(block, 1, size)
pin = libc.malloc(size)
ctypes.memset(pin, 1, size)
full = rss()
for block in blocks:
    libc.free(block)
freed = rss()
released = memory.trim()
print(json.dumps({"full": full, "freed": freed, "trimmed": rss(), "released": released}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_memory_helpers_reach_glibc():
    assert memory.limit_arenas(2) is True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_trim_hands_freed_heap_pages_back_to_the_os():
    run = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rss = json.loads(run.stdout)
    mib = 1 << 20
    # the setup needs a trim: free() alone left the 125 MiB resident (less than 16 MiB went back)
    assert rss["full"] - rss["freed"] < 16 * mib, rss
    # trim() gave at least 100 of those 125 MiB back to the OS, and said so
    assert rss["freed"] - rss["trimmed"] >= 100 * mib, rss
    assert rss["released"] is True
