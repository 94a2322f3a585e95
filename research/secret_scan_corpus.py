"""Measure the secret scan on converted corpora: files scanned, hits per rule (each a false hit on a manual), time.
The scan reads what an ingest reads: each file's text with the Markdown escapes undone (``scan_text``), and each
file's name (its path in the corpus).

Usage: kbflow convert CORPUS... --out MD_DIR, then
    python research/secret_scan_corpus.py MD_DIR --out docs/bench/secret-scan.json
The Markdown that `kbflow convert` writes is the text the scan sees during an ingest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from kbflow.runtime.environment import cpu_info
from kbflow.convert.secrets import find_secrets, redact, rules, scan_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a folder written by `kbflow convert --out`")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    args = parser.parse_args()
    rules()  # compiled before timing
    per_corpus: dict[str, dict] = {}
    hits: list[dict] = []
    started = time.perf_counter()
    for path in sorted(args.folder.rglob("*.md")):
        corpus = path.relative_to(args.folder).parts[0]
        text = path.read_text(encoding="utf-8", errors="replace")
        entry = per_corpus.setdefault(corpus, {"files": 0, "chars": 0, "files_with_hits": 0})
        entry["files"] += 1
        entry["chars"] += len(text)
        found = find_secrets(scan_text(text))
        name = str(path.relative_to(args.folder))
        named = redact(name)[1]
        if found or named:
            entry["files_with_hits"] += 1
            hits += [{"file": name, "rule": f.rule, "line": f.line} for f in found]
            hits += [{"file": redact(name)[0], "rule": rule, "line": 0} for rule in named]
    seconds = time.perf_counter() - started
    result = {
        "command": "kbflow convert CORPUS... --out MD && python research/secret_scan_corpus.py MD --out " + str(args.out),
        "corpora_converted": "the PostgreSQL 15.20 HTML manual, the Python 3.11 HTML documentation, the mixed "
                             "sample corpus (36 files: PDF, Office, EPUB, HTML, images, audio)",
        "date": datetime.now(timezone.utc).date().isoformat(),
        "machine": f"{platform.machine()}, {cpu_info().get('model name', 'unknown CPU')}, {os.cpu_count()} cores",
        "rules": len(rules()), "corpora": per_corpus, "hits": hits, "hits_by_rule": dict(Counter(h["rule"] for h in hits)),
        "files": sum(c["files"] for c in per_corpus.values()), "seconds": round(seconds, 2),
        "mb_per_s": round(sum(c["chars"] for c in per_corpus.values()) / 1e6 / seconds, 1),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "hits"}, indent=2))


if __name__ == "__main__":
    main()
