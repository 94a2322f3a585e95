"""A namespace that an earlier kbflow filled twice, upgraded: what the heal costs.

The earlier version (a checkout of it, run from its source folder with ``--old-src``) ingests a folder, then
`add-document`s some of its files again, which stored each of them a second time under its bare name. This
version then runs `add-document` of the same files (each removes its copy) and a full `ingest` of the folder. The
JSON records documents, store rows, texts embedded and seconds at each step: the heal must embed nothing.

    python research/identity_upgrade.py --old-src /tmp/kbflow-old/src --folder /tmp/pg60 --files 10 \\
        --out docs/bench/identity-upgrade.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from kbflow.runtime.environment import cpu_info

KBFLOW = [sys.executable, "-m", "kbflow"]


def _run(args: list[str], old_src: str | None, data: Path) -> tuple[dict, float]:
    env = {**os.environ, "KBFLOW__EMBEDDER__BACKEND": "local", "HF_HUB_OFFLINE": "1"}
    env.pop("PREFECT_API_URL", None)
    if old_src:  # the earlier version's package, found before the installed one
        env["PYTHONPATH"] = old_src
    started = time.perf_counter()
    done = subprocess.run([*KBFLOW, *args, "--data-dir", str(data), "--json"], env=env, capture_output=True,
                          text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{args}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout), seconds


def _stats(data: Path) -> dict:
    stats, _ = _run(["stats"], None, data)
    return {"documents": stats["documents"], "chunks": stats["chunks"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-src", required=True, help="the earlier version's src folder")
    parser.add_argument("--folder", type=Path, required=True, help="a folder of documents")
    parser.add_argument("--files", type=int, default=10, help="files of the folder added again")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out_text = str(args.out)
    folder, args.out = args.folder.resolve(), args.out.resolve()
    files = sorted(path for path in folder.rglob("*") if path.is_file())[: args.files]
    data = Path(tempfile.mkdtemp(prefix="kbflow-upgrade-"))
    steps = []

    def step(name: str, argv: list[str], old: bool) -> None:
        summary, seconds = _run(argv, args.old_src if old else None, data)
        steps.append({"step": name, "version": "earlier" if old else "this", "seconds": round(seconds, 2),
                      "documents": summary["documents"], "chunks_embedded": summary["chunks"]["embedded"],
                      **{f"after_{k}": v for k, v in _stats(data).items()}})
        print(json.dumps(steps[-1]))

    os.chdir(folder.parent)
    step("ingest the folder", ["ingest", folder.name], old=True)
    for number, path in enumerate(files):
        step(f"add-document {number + 1} of {len(files)}", ["add-document", str(path.relative_to(folder.parent))],
             old=True)
    for number, path in enumerate(files):
        step(f"add-document {number + 1} of {len(files)}", ["add-document", str(path.relative_to(folder.parent))],
             old=False)
    step("ingest the folder", ["ingest", folder.name], old=False)
    healed = [s for s in steps if s["version"] == "this"]
    result = {
        "command": "python research/identity_upgrade.py --old-src OLD/src --folder FOLDER --files "
                   f"{args.files} --out {out_text}",
        "what": "a namespace filled twice by the earlier version (a folder ingested, then some of its files added "
                "again), healed by this version's add-document of the same files and a full ingest",
        "folder": folder.name, "files_in_folder": sum(1 for p in folder.rglob("*") if p.is_file()),
        "files_added_again": len(files), "model": "all-MiniLM-L6-v2 (local)",
        "date": datetime.now(timezone.utc).date().isoformat(),
        "machine": f"{platform.machine()}, {cpu_info().get('model name', 'unknown CPU')}, {os.cpu_count()} cores",
        "documents_before_heal": steps[len(files)]["after_documents"],
        "documents_after_heal": healed[-1]["after_documents"],
        "texts_embedded_by_heal": sum(s["chunks_embedded"] for s in healed),
        "seconds_heal": round(sum(s["seconds"] for s in healed), 2),
        "steps": steps,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=2))


if __name__ == "__main__":
    main()
