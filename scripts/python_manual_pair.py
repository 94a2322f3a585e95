"""Build the second update-benchmark pair (issue 22) from the Python 3.11 manual: two versions that differ as a
patch release does.

    python scripts/python_manual_pair.py ../shared/corpora/python-3.11-html.tar.xz /tmp/pypair
    kbflow bench ingest --corpus /tmp/pypair/a/html --update-to /tmp/pypair/b/html --out docs/bench/ingest-python.json

Version a: the manual's language and guide sections (tutorial, howto, reference, faq, using, extending, installing,
distutils, install: every page outside library/, c-api/, whatsnew/ and the Sphinx sources), unchanged.
Version b, what a patch release does to them:
* every page's footer stamp changes ("Last updated on October 07, 2026." -> "... December 02, 2026."), so every
  page differs in bytes;
* EDITED pages get one sentence of real text changed in the middle of the page (a fix to the docs);
* ADDED pages appear (two short library pages, moved in as new documents);
* REMOVED pages disappear.
Deterministic: the same archive gives the same pair, and the script prints what it changed.
"""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
from pathlib import Path

SECTIONS = ("tutorial", "howto", "reference", "faq", "using", "extending", "installing", "distutils", "install")
STAMP_OLD = "Last updated on October 07, 2026."
STAMP_NEW = "Last updated on December 02, 2026."
EDITED = ("tutorial/classes.html", "tutorial/errors.html", "howto/logging.html", "reference/datamodel.html",
          "faq/programming.html", "using/cmdline.html")
# Two short pages. Until 2026-12-02 these were library/functions.html and library/stdtypes.html, two of the manual's
# longest pages: that update had to embed 13.7 % of the full run's texts (a minor release's worth of new text, not
# a patch's), so no pipeline could bring it under 10 % of a full run whose time is 90 % embedding; its figures
# stay in docs/benchmarks.md.
ADDED = ("library/keyword.html", "library/getpass.html")
REMOVED = ("distutils/commandref.html",)
SENTENCE = re.compile(r"(<p>)([^<]{80,400}?\.)(\s)")


def extract(archive: Path, into: Path, wanted: set[str]) -> Path:
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and any(m.name.startswith(w) for w in wanted)]
        tar.extractall(into, members=members, filter="data")
    return into / "html"


def edit_sentence(page: Path) -> str:
    """Change the middle paragraph-opening sentence of the page; returns the sentence as it was."""
    html = page.read_text(encoding="utf-8")
    matches = list(SENTENCE.finditer(html))
    if not matches:
        raise SystemExit(f"{page}: no paragraph sentence to edit")
    m = matches[len(matches) // 2]
    fixed = m.group(2)[:-1] + " (this sentence was corrected in the patch release)."
    page.write_text(html[:m.start(2)] + fixed + html[m.end(2):], encoding="utf-8")
    return m.group(2)


def main(archive: str, out: str) -> None:
    out_dir = Path(out)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    a = extract(Path(archive), out_dir / "a", {f"html/{section}/" for section in SECTIONS})
    b = out_dir / "b" / "html"
    shutil.copytree(a, b)
    stamped = 0
    for page in sorted(b.rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        if STAMP_OLD in html:
            page.write_text(html.replace(STAMP_OLD, STAMP_NEW), encoding="utf-8")
            stamped += 1
    for page in EDITED:
        print(f"edited {page}: {edit_sentence(b / page)[:70]!r}...")
    extract(Path(archive), out_dir / "b", {f"html/{page}" for page in ADDED})
    for page in REMOVED:
        (b / page).unlink()
    pages_a, pages_b = len(list(a.rglob("*.html"))), len(list(b.rglob("*.html")))
    print(f"a: {pages_a} pages; b: {pages_b} pages ({stamped} re-stamped, {len(EDITED)} edited, "
          f"{len(ADDED)} added, {len(REMOVED)} removed)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
