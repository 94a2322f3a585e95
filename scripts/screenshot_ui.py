#!/usr/bin/env python3
"""Screenshot the Prefect UI as a kbflow user meets it (docs/screenshots/): the Run forms of the on-demand, backfill
and reembed deployments, a Completed ingest run (artifacts, run summary, logs) and a Failed one (state message,
failures artifact).

Needs a Prefect server with the UI on, `kbflow serve` registered against it, and one Completed and one Failed
on-demand ingest run (one whose sources include a broken file); it only reads. The server must be told its own
address when it is not on port 4200 (PREFECT_UI_API_URL=http://HOST:PORT/api), else the UI calls :4200 and shows
"Can't connect to Server API". Drives a system Chromium through Playwright, which is not a kbflow dependency:
install it into its own virtualenv (Playwright's browser download is not needed)::

    python3 -m venv /tmp/shotvenv && /tmp/shotvenv/bin/pip install playwright
    /tmp/shotvenv/bin/python scripts/screenshot_ui.py --url http://127.0.0.1:4300 --out docs/screenshots

Every page is waited for until its own content is there and no spinner or skeleton is left, and every image is
checked not to be blank; a page that does not render is an error (exit 1), never a blank PNG.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# what a page shows while it is still loading, in either UI
BUSY = ".animate-spin, .animate-pulse, [aria-busy='true'], .p-loading-icon, .p-skeleton"


class ScreenshotError(RuntimeError):
    pass


def api(base: str, path: str, body: dict | None = None):
    request = urllib.request.Request(f"{base}{path}", method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def deployment_ids(base: str) -> dict[str, dict]:
    """kbflow's deployments by name (on-demand, backfill, reembed, nightly-<ns>)."""
    flows = {flow["id"]: flow["name"] for flow in api(base, "/flows/filter", {})}
    found = {}
    for deployment in api(base, "/deployments/filter", {}):
        if flows.get(deployment["flow_id"], "").startswith("kbflow-"):
            found[deployment["name"]] = deployment
    for name in ("on-demand", "backfill", "reembed"):
        if name not in found:
            raise ScreenshotError(f"deployment {name!r} is not registered at {base}: run `kbflow serve` against it")
    return found


def artifacts_of(base: str, run_id: str) -> dict[str, dict]:
    """A flow run's artifacts by key suffix: 'progress', 'run-summary' (or 'plan-summary'), 'failures'."""
    found = {}
    for artifact in api(base, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}}):
        for kind in ("progress", "run-summary", "plan-summary", "failures"):
            if (artifact.get("key") or "").endswith(f"-{kind}"):
                found[kind] = artifact
    return found


def pick_run(base: str, deployment_id: str, state: str, run_id: str | None) -> tuple[dict, dict]:
    """The run to show (``run_id``, or the newest ``state`` run of the deployment that wrote a run summary, and
    for a failed run a failures table) and its artifacts."""
    if run_id:
        run = api(base, f"/flow_runs/{run_id}")
        return run, artifacts_of(base, run["id"])
    runs = api(base, "/flow_runs/filter", {
        "flow_runs": {"deployment_id": {"any_": [deployment_id]}, "state": {"type": {"any_": [state]}}},
        "sort": "START_TIME_DESC", "limit": 50})
    for run in runs:
        artifacts = artifacts_of(base, run["id"])
        failures = str((artifacts.get("failures") or {}).get("data") or "")
        if "run-summary" in artifacts and (state != "FAILED" or "| stage |" in failures):
            return run, artifacts
    raise ScreenshotError(f"no {state} ingest run with a run summary{' and failures' if state == 'FAILED' else ''} "
                          f"of deployment {deployment_id}: trigger one first (docs/operations.md)")


def settle(page, must_show: list[str], timeout_s: float = 60.0) -> None:
    """Wait until every text in ``must_show`` is visible and nothing is loading any more."""
    deadline = time.monotonic() + timeout_s
    for text in must_show:
        page.get_by_text(text, exact=False).first.wait_for(state="visible",
                                                           timeout=max(1, deadline - time.monotonic()) * 1000)
    while time.monotonic() < deadline:
        busy = [el for el in page.locator(BUSY).all() if el.is_visible()]
        if not busy:
            break
        page.wait_for_timeout(300)
    else:
        raise ScreenshotError(f"{page.url}: still loading after {timeout_s:.0f} s")
    try:
        page.wait_for_load_state("networkidle", timeout=10_000)
    except Exception:  # a page that polls never goes idle; its content is there already
        pass
    page.wait_for_timeout(800)  # fonts, transitions


# a screenshot is blank when (almost) all of it is one colour; checked in the browser on the PNG itself
BLANK_CHECK = """async (src) => {
  const img = new Image(); img.src = src; await img.decode();
  const canvas = document.createElement('canvas'); canvas.width = img.width; canvas.height = img.height;
  const ctx = canvas.getContext('2d'); ctx.drawImage(img, 0, 0);
  const data = ctx.getImageData(0, 0, img.width, img.height).data;
  const counts = new Map(); let n = 0;
  for (let i = 0; i < data.length; i += 4 * 97) {
    const key = (data[i] >> 3) << 10 | (data[i + 1] >> 3) << 5 | (data[i + 2] >> 3);
    counts.set(key, (counts.get(key) || 0) + 1); n++;
  }
  const top = Math.max(...counts.values());
  return {colours: counts.size, dominant: top / n, width: img.width, height: img.height};
}"""


def shoot(page, path: Path, max_height: int, element: str | None = None) -> dict:
    """A screenshot of the page (as tall as its content, up to ``max_height``) or of one element."""
    if element:
        png = page.locator(element).first.screenshot(animations="disabled")
    else:
        height = page.evaluate("() => Math.max(document.documentElement.scrollHeight, "
                               "...[...document.querySelectorAll('main, [data-main], .p-layout-default__content')]"
                               ".map(e => e.scrollHeight))")
        width = page.viewport_size["width"]
        page.set_viewport_size({"width": width, "height": max(900, min(int(height), max_height))})
        page.wait_for_timeout(500)
        png = page.screenshot(animations="disabled")
    stats = page.evaluate(BLANK_CHECK, "data:image/png;base64," + base64.b64encode(png).decode())
    if stats["colours"] < 12 or stats["dominant"] > 0.97:
        raise ScreenshotError(f"{path.name}: looks blank ({stats}) at {page.url}")
    path.write_bytes(png)
    page.set_viewport_size({"width": page.viewport_size["width"], "height": 900})
    return {"file": str(path), "bytes": len(png), **stats, "url": page.url}


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).first.click()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:4200", help="the Prefect UI (default %(default)s)")
    parser.add_argument("--api", help="the Prefect API (default: URL/api)")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"), help="folder for the PNGs")
    parser.add_argument("--ui", choices=["v2", "v1"], default="v2",
                        help="which UI: v2 is what the server's root opens in Prefect 3.9 (default %(default)s)")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the browser (default %(default)s)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--max-height", type=int, default=2000, help="tallest page image, in pixels")
    parser.add_argument("--completed-run", help="flow run id of the Completed ingest to show (default: the newest "
                        "on-demand one with a run summary)")
    parser.add_argument("--failed-run", help="flow run id of the Failed ingest to show (default: the newest "
                        "on-demand one with a failures table)")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    ui = args.url.rstrip("/")
    base = (args.api or f"{ui}/api").rstrip("/")
    prefix = f"{ui}/v2" if args.ui == "v2" else ui
    deployments = deployment_ids(base)
    on_demand, backfill, reembed = (deployments[n]["id"] for n in ("on-demand", "backfill", "reembed"))
    completed, done = pick_run(base, on_demand, "COMPLETED", args.completed_run)
    failed, broken = pick_run(base, on_demand, "FAILED", args.failed_run)
    args.out.mkdir(parents=True, exist_ok=True)
    taken = []
    with tempfile.TemporaryDirectory(prefix="kbflow-shots-") as profile, sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            profile, executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": args.width, "height": 900}, color_scheme="light")
        try:
            page = browser.new_page()

            def visit(path: str, must_show: list[str]) -> None:
                page.goto(f"{prefix}{path}", wait_until="domcontentloaded")
                settle(page, must_show)

            def save(name: str, **kwargs) -> None:
                taken.append(shoot(page, args.out / name, args.max_height, **kwargs))
                print(json.dumps(taken[-1]))

            # the Run forms ("Run" -> "Custom run" on a deployment)
            visit(f"/deployments/deployment/{on_demand}/run", ["Parameters", "Sources", "Allow mass delete"])
            save("on-demand-run-form.png")
            visit(f"/deployments/deployment/{backfill}/run", ["Parameters", "Namespaces", "Changed since"])
            save("backfill-run-form.png")
            visit(f"/deployments/deployment/{reembed}/run", ["Parameters", "Model"])
            if args.ui == "v2":  # open the model drop-down: the choices are the form's point
                page.get_by_text("Select", exact=True).first.click()
                page.get_by_role("option", name="usem3", exact=True).wait_for(state="visible")
            save("reembed-run-form.png")

            # a Completed ingest: its artifacts, the run summary table, its logs
            visit(f"/runs/flow-run/{completed['id']}?tab=Artifacts", [completed["name"], "Artifacts"])
            open_tab(page, "Artifacts")
            settle(page, [done["run-summary"]["key"], done["failures"]["key"], done["progress"]["key"]])
            save("ingest-completed-artifacts.png")
            open_tab(page, "Logs")
            settle(page, ["ingest request"])
            save("ingest-completed-logs.png")
            visit(f"/artifacts/artifact/{done['run-summary']['id']}", [done["run-summary"]["key"], "embedded"])
            save("ingest-completed-run-summary.png")

            # a Failed ingest: the state message, and the failures artifact saying which file and why
            visit(f"/runs/flow-run/{failed['id']}?tab=Details", [failed["name"], "Failed"])
            open_tab(page, "Details")
            settle(page, ["State Message", "failure(s)"])
            save("ingest-failed-details.png")
            visit(f"/artifacts/artifact/{broken['failures']['id']}", [broken["failures"]["key"], "Failures of"])
            save("ingest-failed-failures.png")
        finally:
            browser.close()
    too_big = [shot["file"] for shot in taken if shot["bytes"] > 400_000]
    if too_big:
        print(f"warning: over 400 KB: {too_big}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ScreenshotError as exc:
        print(f"screenshot_ui: {exc}", file=sys.stderr)
        sys.exit(1)
