"""kbflow.memory: malloc arenas and trimming (what keeps an ingest's resident set from ratcheting up)."""

import sys

import pytest

from kbflow import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_memory_helpers_reach_glibc():
    assert memory.limit_arenas(2) is True
    blocks = [bytearray(64 * 1024) for _ in range(2000)]  # ~128 MB in small blocks, then freed
    del blocks
    assert isinstance(memory.trim(), bool)
