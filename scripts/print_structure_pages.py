"""Builds the page set of `kbflow bench convert --structure`: HTML pages that hold tables, each beside the PDF a
real browser printed from it.

    python scripts/print_structure_pages.py OUT_DIR TARBALL[:COUNT] ...

For each HTML tarball of a documentation set (the Python manual, the LibreOffice help, the Debian handbook, the
PostgreSQL manual), the pages that hold a <table> are listed by path, generated index pages left out, and COUNT
of them (default 12) are taken at even steps through that list. Chinese pages need a CJK font on the machine
(Debian package ``fonts-wqy-zenhei``): without one Chromium prints empty boxes and a text layer that has lost
characters. Each is printed by headless Chromium (Debian package ``chromium``) from the
unpacked tree, so its stylesheets and images apply, with the document outline that Chromium writes from the
page's headings (``--generate-pdf-document-outline``) and without the browser's header and footer. OUT_DIR gets
``<set>/<page>.html`` and ``<set>/<page>.pdf``; the HTML's conversion is the ground truth the PDF's is scored on.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

NAVIGATION_RE = re.compile(r"^(genindex|py-modindex|modindex|search|index)\b")  # generated indexes: links only
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-pdf-header-footer", "--generate-pdf-document-outline"]


def pick(pages: list[Path], count: int) -> list[Path]:
    if len(pages) <= count:
        return pages
    return [pages[round(i * (len(pages) - 1) / (count - 1))] for i in range(count)] if count > 1 else pages[:1]


def main(out: Path, specs: list[str]) -> None:
    if shutil.which("chromium") is None:
        sys.exit("chromium is not installed: apt-get install chromium")
    for spec in specs:
        tarball, _, count = spec.partition(":")
        name = Path(tarball).name.split("-html")[0]
        with tempfile.TemporaryDirectory() as unpacked, tempfile.TemporaryDirectory() as profile:
            with tarfile.open(tarball) as archive:
                archive.extractall(unpacked, filter="data")
            pages = sorted(p for p in Path(unpacked).rglob("*.htm*")
                           if b"<table" in p.read_bytes() and not NAVIGATION_RE.search(p.name))
            target = out / name
            target.mkdir(parents=True, exist_ok=True)
            for page in pick(pages, int(count or 12)):
                stem = "_".join(page.relative_to(unpacked).with_suffix("").parts[-3:])
                shutil.copyfile(page, target / f"{stem}.html")
                subprocess.run(CHROMIUM + [f"--user-data-dir={profile}", f"--print-to-pdf={target / stem}.pdf",
                                           page.as_uri()], check=True, capture_output=True, timeout=120)
                print(target / f"{stem}.pdf")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2:])
