"""`kbflow bench memory`'s parts: the half is spread over the whole sorted file list, and the RSS probe sums
a real process tree."""

from __future__ import annotations

import os
import subprocess
import sys

from kbflow.bench.memory import share_of, tree_rss_mb


def test_share_takes_every_other_file_and_keeps_relative_paths(tmp_path):
    root = tmp_path / "corpus"
    files = []
    for i in range(10):
        path = root / ("a" if i < 5 else "b") / f"page-{i}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x" * (i + 1))
        files.append(path)
    count, size = share_of(files, root, 0.5, tmp_path / "half")
    chosen = sorted(p.relative_to(tmp_path / "half").as_posix() for p in (tmp_path / "half").rglob("*.html"))
    assert count == 5 and chosen == [f"{'a' if i < 5 else 'b'}/page-{i}.html" for i in (0, 2, 4, 6, 8)]
    assert size == sum(i + 1 for i in (0, 2, 4, 6, 8))
    assert share_of(files, root, 1.0, tmp_path / "all") == (10, sum(range(1, 11)))


def test_tree_rss_counts_children(tmp_path):
    own = tree_rss_mb(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
                              "print('ready', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert tree_rss_mb(os.getpid()) > own + 150  # the child's 200 MB, touched page by page, is resident
    finally:
        child.kill()
        child.wait()
