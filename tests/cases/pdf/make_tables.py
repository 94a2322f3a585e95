"""tables.html, and the PDFs headless Chromium prints from it: tables.pdf (with the document outline Chromium
writes from the headings) and tables-plain.pdf (without one). The page holds what PDF structure recovery must
get right: a ruled table long enough to run over a page break, an unruled one whose wrapped description sits
beside an option centred in its tall row, a code block whose comments line up like columns, numbered headings,
and a site menu under a heading at the end. Run from this folder: python make_tables.py (needs Debian's
chromium)."""

import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
ROWS = "\n".join(
    f"<tr><td>svc-{n:02d}</td><td>{7000 + n}</td><td>{'udp' if n % 3 == 0 else 'tcp'}</td>"
    f"<td>{'Replicates the write-ahead log to the standby servers of the cluster, one stream per standby' if n % 10 == 0 else 'Serves requests'}</td></tr>"
    for n in range(1, 71))
PAGE = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Port Guide</title></head>
<body>
<h1>Port Guide</h1>
<h2>1 Overview</h2>
<p>This guide lists the ports each service of the cluster listens on, and the options of the port checker.</p>
<h2>2 Services</h2>
<h3>2.1 Ruled ports table</h3>
<p><b>Table 2.1. Service ports</b></p>
<table border="1">
<thead><tr><th>Service</th><th>Port</th><th>Protocol</th><th>Notes</th></tr></thead>
<tbody>
{ROWS}
</tbody>
</table>
<h3>2.2 Unruled options</h3>
<p>The port checker takes these options:</p>
<table>
<thead><tr><th>Option</th><th>Meaning</th></tr></thead>
<tbody>
<tr><td>--all</td><td>Check every port of every service.</td></tr>
<tr><td>--verbose</td><td>Print each port as it is checked, with the service that owns it, the protocol it speaks,
the time the check took and the answer the service gave, so that a slow or silent service stands out in the
output of a long run.</td></tr>
<tr><td>--quiet</td><td>Print nothing but failures.</td></tr>
<tr><td>--timeout</td><td>Seconds to wait for each port.</td></tr>
</tbody>
</table>
<p>A run from a shell script:</p>
<pre>
check --all          # every service
check --quiet        # failures only
check --timeout 5    # give up after five seconds
</pre>
<h2>3 Where next</h2>
<p>The checker reports to the operations dashboard.</p>
<h3>Next topic</h3>
<p><a href="https://example.org/guide/alerts.html">Alerts and escalation</a></p>
<p><a href="https://example.org/guide/index.html">Index of the guide</a></p>
</body></html>
"""
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-pdf-header-footer"]

if __name__ == "__main__":
    (HERE / "tables.html").write_text(PAGE, encoding="utf-8")
    for name, extra in (("tables.pdf", ["--generate-pdf-document-outline"]), ("tables-plain.pdf", [])):
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(CHROMIUM + extra + [f"--user-data-dir={profile}", f"--print-to-pdf={HERE / name}",
                                               (HERE / "tables.html").as_uri()], check=True, capture_output=True)
