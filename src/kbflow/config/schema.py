"""Typed configuration, validated once at load. A bad value names the field and the fix."""

from __future__ import annotations

import os
from collections.abc import Callable
import re
from pathlib import Path
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kbflow.config.connection import InteractiveConnection, Moves, RerankConnection, SpeechConnection, move_keys
from kbflow.config.embedders import AutoEmbedder, EmbedderConfig, migrate_flat_keys
from kbflow.core.errors import ConfigError
from kbflow.core.http import DASHSCOPE_RERANK_PATH

NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _rerank_url(value: object) -> tuple[str, object]:
    """The old ``search.rerank.dashscope_url`` (a whole endpoint) as the connection's API base."""
    if value is None:
        return "", None
    if not isinstance(value, str) or not value.rstrip("/").endswith(DASHSCOPE_RERANK_PATH):
        raise ConfigError(f"search.rerank.dashscope_url {value!r} does not end in {DASHSCOPE_RERANK_PATH}: set "
                          "search.rerank.connection.base_url to the DashScope API base instead")
    return "base_url", value.rstrip("/")[:-len(DASHSCOPE_RERANK_PATH)]


def _chat_base_url(value: object) -> tuple[str, object]:
    """The old ``search.llm.base_url_env`` (a variable's name): the URL that variable holds now, as the
    connection's base URL; the default variable means the default."""
    if value in (None, "OPENAI_BASE_URL"):
        return "", None
    return "base_url", os.environ.get(str(value), "").strip() or None


def _key_env(usual: str):
    """The old ``api_key_env``: its old default, the provider's usual variable, is the connection's default."""
    return lambda value: ("", None) if value in (None, usual) else ("api_key_env", value)


# flat keys of the sections that call a remote service, before they had a connection: (section path, connection
# field, old key -> new key under it)
OLD_CONNECTION_KEYS: list[tuple[tuple[str, ...], str, dict]] = [
    (("convert",), "dashscope", {"dashscope_api_key_env": _key_env("DASHSCOPE_API_KEY"), "dashscope_base_url": "base_url",
                                 "dashscope_timeout_s": "timeout_s", "dashscope_retries": "retries"}),
    (("search", "rerank"), "connection", {"api_key_env": _key_env("DASHSCOPE_API_KEY"), "timeout_s": "timeout_s",
                                          "retries": "retries", "dashscope_url": _rerank_url}),
    (("search", "llm"), "connection", {"api_key_env": _key_env("OPENAI_API_KEY"), "timeout_s": "timeout_s", "retries": "retries",
                                       "base_url_env": _chat_base_url}),
]


def _moved(section: tuple[str, ...], data: object) -> object:
    """``data`` for ``section`` with its old flat connection keys moved (a section built in code, not a file)."""
    _, field, renames = next(entry for entry in OLD_CONNECTION_KEYS if entry[0] == section)
    return move_keys(data, ".".join(section), renames, field)[0]


def _move_connection_keys(raw: dict, later: Callable[[tuple[str, ...]], int]) -> Moves:
    """Move the old flat connection keys of ``raw`` (a whole config mapping) in place; a key written both ways
    keeps the value from the later source (``later`` ranks a key's source)."""
    moves: Moves = []
    for section, field, renames in OLD_CONNECTION_KEYS:
        parent: dict = raw
        for part in section[:-1]:
            child = parent.get(part)
            parent = child if isinstance(child, dict) else {}
        if isinstance(parent.get(section[-1]), dict):
            def nested_wins(old: str, new: str, section: tuple[str, ...] = section, field: str = field) -> bool:
                return later((*section, field, new)) > later((*section, old))

            parent[section[-1]], section_moves = move_keys(parent[section[-1]], ".".join(section), renames, field,
                                                           nested_wins)
            moves += section_moves
    return moves


class ConvertConfig(_Section):
    workers: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        "auto", description="Processes converting files in parallel: 1 converts in the flow's process; 'auto' uses "
        "one per core (at most 4) for a run that converts 200 files or more and converts in-process below that or "
        "where the process may not start children (a Dask worker).")
    worker_nice: int = Field(
        19, ge=0, le=19, description="Niceness of the conversion worker processes (workers > 1, on Linux): at 19 "
        "they use the cores the embedding model leaves idle, so conversion running ahead of the model in an ingest "
        "does not slow it, and a niced worker's time limit counts the CPU time it got; 0 shares the cores equally.")
    max_file_mb: float = Field(50.0, gt=0, description="Files larger than this are recorded as failures, not converted.")
    timeout_s: float = Field(120.0, gt=0, description="Per-file conversion time limit, in seconds (with workers > 1 "
                             "a stuck worker is killed; a niced worker's limit is CPU seconds, and at most 4 times "
                             "as many seconds of wall time).")
    include: list[str] = Field(default_factory=lambda: ["*"], description="Glob patterns of file names to ingest.")
    exclude: list[str] = Field(
        default_factory=lambda: [".*", "*~", "*.tmp", "Thumbs.db"],
        description="Glob patterns of file or folder names to skip (hidden files by default).",
    )
    pdf_engine: Literal["pdfium", "markitdown"] = Field(
        "pdfium", description="PDF text path: 'pdfium' (fast, per-page; pages without a text layer are OCR'd) "
        "or 'markitdown' (pdfminer, slower, no OCR).")
    pdf_passwords_env: str = Field(
        "KBFLOW_PDF_PASSWORDS", description="Name of the environment variable holding passwords to try on "
        "encrypted PDFs, one per line (never the passwords themselves).")
    ocr: bool = Field(True, description="OCR images and PDF pages without a text layer (offline, English + Chinese).")
    ocr_max_side: int = Field(2000, ge=320, le=8000, description="Longest image side, in pixels, given to OCR; larger images are scaled down.")
    ocr_pdf_dpi: int = Field(200, ge=72, le=600, description="Resolution at which a PDF page without text is rendered for OCR.")
    audio_backend: Literal["auto", "whisper", "pocketsphinx", "dashscope"] = Field(
        "auto", description="Speech recognition: 'whisper' (offline, multilingual, faster-whisper), 'pocketsphinx' "
        "(offline, English only, rough), 'dashscope' (needs the key), 'auto' = DashScope when its API key variable "
        "is set, else Whisper.")
    whisper_model_dir: str | None = Field(
        None, description="A CTranslate2 Whisper model folder (model.bin, config.json, tokenizer.json, "
        "vocabulary.txt) for the whisper backend. Empty: the packaged Whisper base (multilingual, MIT).")
    whisper_language: str | None = Field(
        None, description="Whisper language code of the recordings ('en', 'zh', ...). Empty: detected per file.")
    dashscope: SpeechConnection = Field(
        default_factory=SpeechConnection, description="How speech recognition reaches DashScope (audio_backend "
        "'dashscope', or 'auto' with the key set): key variable, API base, timeout, retries.")
    dashscope_asr_model: str = Field("qwen3-asr-flash", description="DashScope speech recognition model.")

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: object) -> object:
        return _moved(("convert",), data)
    zip_max_total_mb: float = Field(500.0, gt=0, description="An archive whose members add up to more than this (uncompressed) is refused as a possible ZIP bomb.")
    zip_max_members: int = Field(10000, ge=1, description="An archive with more members than this is refused.")
    max_line_chars: int = Field(1_000_000, ge=1000, description="A text file with a longer line is refused (minified or binary data).")
    html_max_depth: int = Field(200, ge=10, le=400, description="HTML nested deeper than this is refused (it would exhaust the converter's recursion).")
    secret_scan: bool = Field(True, description="Scan each file's text for credentials (private key blocks, cloud "
                              "access keys, API tokens) before it is stored: a file with a hit is a failure naming "
                              "the rule and line (never the secret) and is not stored (docs/security.md).")
    secret_scan_allow: list[str] = Field(
        default_factory=list, description="Glob patterns of source paths (as in search results, e.g. "
        "'docs/examples/*') whose files are stored even when the secret scan finds something in them.")


class ChunkConfig(_Section):
    chunk_tokens: int | None = Field(
        None,
        ge=16,
        description="Most tokens a chunk may hold, heading prefix and special tokens included. "
        "Empty means what the embedding model can read: 512 tokens for the default multilingual-e5-small (e5), "
        "256 word pieces for all-MiniLM-L6-v2 (local).",
    )
    overlap_tokens: int = Field(32, ge=0, description="Tokens of trailing context repeated at the start of the next chunk of a section.")
    heading_prefix: bool = Field(
        True, description="Embed 'heading path: text' while storing the text alone, so a chunk carries its section title."
    )


# the store kinds kbflow ships (kbflow.stores.<name>_store); a plugin's kind joins them when its package is installed
# (kbflow.stores.kinds reads the plugins; only their names are read here)
BUILTIN_STORE_KINDS = ("lancedb", "qdrant")
STORE_ENTRY_POINT_GROUP = "kbflow.stores"
if TYPE_CHECKING:
    StoreKindName = Literal["lancedb", "qdrant"]
else:
    StoreKindName = Literal[(*BUILTIN_STORE_KINDS, *sorted(
        {point.name for point in entry_points(group=STORE_ENTRY_POINT_GROUP)} - set(BUILTIN_STORE_KINDS)))]


class StoreConfig(_Section):
    kind: StoreKindName = Field(
        "lancedb", description="Vector store: 'lancedb' (embedded under the data dir) or 'qdrant'."
    )
    uri: str | None = Field(None, description="LanceDB location. Empty means '<data_dir>/lancedb'.")
    mirror: bool = Field(True, description="LanceDB in a bucket: searches read a local copy of the table, brought "
                         "up to the bucket's newest version before each search (one small LIST request; new files "
                         "only). false: every search reads the bucket (seconds per query).")
    mirror_dir: str | None = Field(None, description="Where that copy is kept. Empty means "
                                   "$XDG_CACHE_HOME/kbflow/mirror (~/.cache/kbflow/mirror).")
    qdrant_location: str | None = Field(
        None,
        description="Qdrant: a server URL (http://host:6333), a folder for embedded local mode, or ':memory:'. "
        "Empty means local mode in '<data_dir>/qdrant'.",
    )
    qdrant_api_key_env: str = Field(
        "QDRANT_API_KEY", description="Name of the environment variable holding the Qdrant API key (never the key)."
    )


class FlowConfig(_Section):
    doc_batch: int = Field(
        100, ge=1, le=500, description="Documents per convert/split/chunk/upsert task run (one store commit)."
    )
    max_workers: int = Field(2, ge=1, le=64, description="Embed stage calls in flight at once (plus one "
                             "conversion running ahead).")
    embed_gather_docs: int = Field(
        400, ge=1, le=5000, description="Documents whose chunks may wait, converted and chunked, while the model "
        "embeds earlier ones, until enough texts are missing from the vector cache to fill the embed calls "
        "(embedder.task_batch x max_workers): an update with few new texts per batch embeds them in full calls. "
        "A model with nothing to do gets the texts waiting at once. Bounds the memory that waiting takes.")
    orchestrator: Literal["auto", "prefect", "direct"] = Field(
        "auto", description="How `kbflow ingest`, `add-text`, `reembed` and the library run the engine: 'prefect' "
        "as a Prefect flow run (task runs, artifacts, logs in the UI); 'direct' in this process with the same "
        "stages and retries, no server; 'auto' = prefect when PREFECT_API_URL is set or runner.kind is not "
        "'threads', else direct.")
    keep_runs: int = Field(20, ge=1, description="Run snapshot folders kept per namespace; older ones are pruned.")
    cache_days: float = Field(7.0, gt=0, description="Days a cached stage result stays valid; older result files are pruned.")
    max_delete_fraction: float = Field(
        0.3, ge=0, le=1, description="Refuse a run that would delete more than this share of a namespace's documents."
    )
    lock_wait_s: float = Field(
        600.0, ge=0, description="Seconds a write waits for another write to the same namespace to finish before "
        "it gives up: from this process (threads, an MCP server, a backfill) or from another process or machine "
        "(its lock file or lease; the wait names the holder). A lock whose holder is provably gone is taken over.")


class RerankConfig(_Section):
    kind: Literal["cross-encoder", "dashscope"] = Field(
        "cross-encoder", description="'cross-encoder': a local sentence-transformers CrossEncoder from model_path; "
        "'dashscope': DashScope's text-rerank API (see connection).")
    model_path: str | None = Field(None, description="Folder of a local CrossEncoder model (required for kind cross-encoder).")
    candidates: int = Field(50, ge=1, le=1000, description="Hybrid candidates the reranker scores per query.")
    batch_size: int = Field(32, ge=1, description="Query-passage pairs per cross-encoder forward pass.")
    dashscope_model: str = Field("gte-rerank-v2", description="DashScope rerank model name.")
    connection: RerankConnection = Field(
        default_factory=RerankConnection, description="How kind 'dashscope' reaches DashScope: key variable "
        "(empty: DASHSCOPE_API_KEY), API base, timeout, retries.")

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: object) -> object:
        return _moved(("search", "rerank"), data)


class LlmConfig(_Section):
    kind: Literal["openai", "local"] = Field(
        "openai", description="'openai': an OpenAI-compatible endpoint (connection: OpenAI, "
        "DashScope, vLLM, Ollama...); 'local': a GGUF chat model run in this process by llama.cpp (model_path).")
    model_path: str | None = Field(None, description="kind local: the GGUF chat model file.")
    context_tokens: int = Field(4096, ge=512, le=131072, description="kind local: the model's context window "
                                "used, in tokens; ask packs sources into it, leaving max_tokens for the answer.")
    threads: int | None = Field(None, ge=1, le=256, description="kind local: CPU threads. Empty: every core.")
    connection: InteractiveConnection = Field(
        default_factory=InteractiveConnection, description="kind openai: the endpoint. base_url empty means the "
        "OPENAI_BASE_URL variable, api_key_env empty means OPENAI_API_KEY. For DashScope use its compatible mode: "
        "https://dashscope.aliyuncs.com/compatible-mode/v1 with DASHSCOPE_API_KEY.")

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: object) -> object:
        return _moved(("search", "llm"), data)
    model: str = Field("gpt-4o-mini", description="kind openai: chat model name sent to /chat/completions (e.g. qwen-plus on DashScope).")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature of answers and expansions.")
    max_tokens: int = Field(800, ge=16, description="Most tokens of one completion.")
    mqe_queries: int = Field(3, ge=1, le=10, description="Extra phrasings multi-query expansion asks for.")
    context_chunks: int = Field(6, ge=1, le=50, description="Retrieved chunks given to the model by `ask`.")


class GraphConfig(_Section):
    enabled: bool = Field(False, description="Build the namespace's graph after chunking (kbflow.graph): links "
                          "between pages and sections, defined terms, section headings; search mode 'graph' "
                          "follows it. Turning it on or off re-processes every document once (conversions and "
                          "vectors come from their caches).")
    seeds: int = Field(5, ge=1, le=50, description="Search mode graph: the query's best hybrid hits whose links "
                       "are followed.")
    hops: int = Field(1, ge=1, le=3, description="Search mode graph: links followed from a seed, one after another.")
    per_target: int = Field(2, ge=1, le=20, description="Search mode graph: chunks taken from each linked "
                            "document (those closest to the query; the one its link's anchor names first).")
    max_targets: int = Field(40, ge=1, le=500, description="Search mode graph: linked documents read per hop (the "
                             "ones linked from the best seeds first).")
    insert_after: int = Field(3, ge=0, le=100, description="Search mode graph: hybrid's first hits kept in their "
                              "places; the graph's chunks come right after them.")
    slots: int = Field(1, ge=1, le=50, description="Search mode graph: chunks reached through the graph inserted "
                       "after hybrid's first insert_after hits (those closest to the query); hybrid's later hits "
                       "move down by this many places at most.")
    llm_extract: bool = Field(False, description="Also extract entities and relations with the chat model of "
                              "search.llm (remote, or a local GGUF): one call per chunk text not extracted before "
                              "(kbflow.graph.llm_extract). Slow on CPU: see docs/retrieval.md#graph-search.")
    llm_workers: int = Field(4, ge=1, le=32, description="Extraction requests in flight at once to a remote chat "
                             "model (a local model answers one at a time).")
    llm_max_tokens: int = Field(1000, ge=64, le=4000, description="Most tokens of one extraction reply (12 "
                                "entities and 12 relations take ~600).")


class AgenticConfig(_Section):
    max_rounds: int = Field(3, ge=1, le=10, description="`ask --agentic`: retrieval rounds at most (a comparison's "
                            "parallel searches are one round).")
    evidence_per_round: int = Field(4, ge=1, le=20, description="`ask --agentic`: hits each search of a round "
                                    "adds to the evidence (and shows the planner, cut to 400 characters each).")
    planner_tokens: int = Field(160, ge=32, le=2000, description="`ask --agentic`: most tokens of one planning "
                                "reply (the strategy, the next query).")
    max_planner_prompt_tokens: int = Field(12000, ge=500, description="`ask --agentic`: prompt tokens all "
                                           "planning calls of one question may use together (counted by a local "
                                           "model's tokenizer, else estimated as characters / 4); when the next "
                                           "call would pass it, the rounds stop and the answer uses the evidence "
                                           "found so far.")


class SearchConfig(_Section):
    limit: int = Field(5, ge=1, le=1000, description="Hits returned by default.")
    min_score: float | None = Field(
        None, description="Drop hits scoring below this, in the mode's own unit: cosine similarity -1..1 (vector), "
        "BM25 score ≥ 0 (bm25), fused score (hybrid: RRF sum ≤ 2/(rrf_k+1), weighted 0..1), reranker score (rerank), "
        "hybrid's fused score (graph). Empty keeps every hit.")
    mode: Literal["vector", "bm25", "hybrid", "rerank", "graph"] = Field(
        "hybrid", description="Default search mode. Hybrid (vector + BM25, merged as search.fusion says) stays close "
        "to the better of its two inputs on every measured set and is often above it (figures per mode and set: "
        "docs/retrieval.md).")
    fusion: Literal["trusted", "standout", "weighted", "rrf"] = Field(
        "trusted", description="How hybrid merges vector and BM25 candidates: 'trusted' (the default) a "
        "min-max-scaled sum whose BM25 share is lowered per query when BM25's first ten hits share few chunks with "
        "the vector list's (down to bm25_floor of the share with none in common); 'standout' the sum with BM25's "
        "share lowered when its best hit stands out of its list less than the vector list's best does; 'weighted' "
        "the sum at fixed shares; 'rrf' reciprocal rank fusion. Chosen by leave-one-set-out over nine dev set x "
        "model pairs, above the better of its inputs on every one (docs/retrieval.md).")
    bm25_floor: float = Field(0.8, ge=0, le=1, description="Trusted and standout fusion: the part of BM25's share "
                              "it keeps when its list shows no confidence (trusted: its first ten hits share no "
                              "chunk with the vector list's, full share from three in common; standout: its best "
                              "hit does not stand out of its list).")
    rrf_k: int = Field(60, ge=1, description="RRF constant: score = sum of 1/(rrf_k + rank).")
    vector_weight: float = Field(0.5, ge=0, le=1, description="Weighted, standout and trusted fusion: share of the "
                                 "min-max-scaled vector score; BM25 gets the rest (trusted and standout lower BM25's "
                                 "share per query from there). 0.5: equal shares, because a weight fitted to one kind of "
                                 "question set does not carry over to others (docs/retrieval.md).")
    candidates: int = Field(50, ge=1, le=2000, description="Candidates fetched from each of vector and BM25 for hybrid.")
    vector_index_min_rows: int = Field(
        10_000, ge=1, description="LanceDB builds an ANN vector index once a namespace holds this many chunks "
        "(below it an exact scan is fast: see docs/bench/search.json).")
    exact_in_memory_rows: int = Field(
        20_000, ge=0, description="LanceDB: a vector search with no filter of a namespace with no vector index and at "
        "most this many chunks is answered from a copy of its vectors in the searching process's memory (read once "
        "per table version; the same hits, without LanceDB's per-query overhead of several ms). 0 turns it off.")
    vector_index_type: Literal["IVF_HNSW_SQ", "IVF_PQ", "IVF_FLAT", "IVF_HNSW_FLAT"] = Field(
        "IVF_FLAT", description="LanceDB ANN index type, built with sqrt(rows) partitions and trained again as the "
        "table grows fourfold. IVF_FLAT (the default) keeps exact vectors in each partition, so recall depends only "
        "on ann_nprobes; the quantized types trade recall for size (recall and build time per type: "
        "docs/retrieval.md, Search benchmark).")
    ann_nprobes: int = Field(20, ge=1, description="IVF partitions searched per query (LanceDB): with sqrt(rows) "
                             "partitions a query reads ~nprobes x sqrt(rows) vectors.")
    ann_ef: int = Field(128, ge=1, description="HNSW candidate list size per query (LanceDB IVF_HNSW_* only): larger "
                        "finds more of the true neighbours for more time per query (`kbflow bench search`'s ANN "
                        "sweep, docs/retrieval.md).")
    ann_refine_factor: int | None = Field(
        None, ge=1, description="LanceDB: fetch refine_factor x k candidates from the vector index and re-rank them by "
        "their full vectors (undoes the scalar quantization's error); empty: off. What it gains per table size: "
        "docs/retrieval.md.")
    bm25_k1: float = Field(1.2, gt=0, description="BM25 k1 of Qdrant's sparse vectors (LanceDB uses its own 1.2).")
    bm25_b: float = Field(0.75, ge=0, le=1, description="BM25 b of Qdrant's sparse vectors (LanceDB uses its own 0.75).")
    bm25_avg_len: float = Field(120.0, gt=0, description="Qdrant BM25: assumed mean words per chunk (fixed at write time).")
    rerank: RerankConfig = Field(default_factory=RerankConfig)
    llm: LlmConfig = Field(default_factory=LlmConfig)
    agentic: AgenticConfig = Field(default_factory=AgenticConfig)


class ScheduleConfig(_Section):
    namespace: str = Field(..., description="Namespace this nightly deployment ingests.")
    sources: list[str] = Field(
        default_factory=list, description="Files and folders it ingests. Empty means the config's `sources`."
    )
    cron: str = Field("0 2 * * *", description="When it runs, as a cron expression (five fields).")
    timezone: str = Field("UTC", description="IANA time zone the cron expression is read in.")

    @field_validator("namespace")
    @classmethod
    def _namespace_ok(cls, value: str) -> str:
        return check_namespace(value)


class DeployConfig(_Section):
    schedules: list[ScheduleConfig] = Field(
        default_factory=lambda: [ScheduleConfig(namespace="default")],
        description="One nightly ingest deployment per entry (`kbflow serve`, deployments/prefect.yaml); "
        "the backfill flow's 'all namespaces' means these.",
    )
    backfill_concurrency: int = Field(2, ge=1, le=32, description="Namespaces a backfill ingests at the same time.")
    source_roots: list[str] | None = Field(
        None, description="Folders (and URL prefixes such as s3://bucket/docs/) that served deployments may read: "
        "a Run form's or a backfill's source outside them fails the run before anything is read "
        "(docs/security.md). Empty: the folders of this config's own sources and deploy.schedules sources.")


class McpConfig(_Section):
    roots: list[str] = Field(
        default_factory=list, description="Folders whose files MCP clients may add by path (`kbflow mcp --root`, "
        "which adds to these). A path is accepted only when its real path, symlinks and '..' resolved, lies under "
        "one of them. Empty: adding by path is refused; inline content still works.")
    allow_sources: list[str] = Field(
        default_factory=list, description="URL prefixes MCP clients may add from (`--allow-source`, e.g. "
        "s3://team-docs/ or https://docs.example.com/manual/). http(s) URLs to loopback, link-local or private "
        "addresses are refused unless a prefix names that host; every redirect is checked again.")
    max_inline_mb: float | None = Field(
        None, gt=0, description="Largest inline document (add_document content / content_base64) in MB, decoded. "
        "Empty: convert.max_file_mb. The HTTP transport's request limit is set to fit it as base64.")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host header values (name or name:port) the HTTP transport accepts "
        "besides the bind address (`--allowed-host`): the names clients use to reach a server bound to 0.0.0.0. "
        "Requests naming another host get 421, from a browser page of another origin 403.")


class RunnerConfig(_Section):
    kind: Literal["threads", "processes", "dask"] = Field(
        "threads",
        description="Prefect task runner of the ingest flow: 'threads' (one process), 'processes' (a local "
        "process pool) or 'dask' (a Dask cluster, see dask_address).",
    )
    dask_address: str | None = Field(
        None,
        description="Dask scheduler address (tcp://host:8786) for kind 'dask'. Empty starts a temporary "
        "LocalCluster of dask_workers processes for the run.",
    )
    dask_workers: int = Field(2, ge=1, le=256, description="Worker processes of the temporary LocalCluster.")


class WebConfig(_Section):
    """How web sources (a sitemap, or a start page to crawl) are read; see docs/web.md."""

    user_agent: str = Field(
        "kbflow (+https://pypi.org/project/kbflow/)", min_length=1,
        description="User-Agent sent with every request, and the name robots.txt rules are matched against.")
    requests_per_second: float = Field(
        4.0, gt=0, le=100, description="Requests started per second per host at most; a robots.txt Crawl-delay "
        "that asks for more time between requests wins.")
    concurrency: int = Field(2, ge=1, le=32, description="Requests in flight at once per host.")
    timeout_s: float = Field(30.0, gt=0, description="Per-request time limit, in seconds; a page that times out "
                             "is a failure and keeps its stored version.")
    max_page_mb: float = Field(20.0, gt=0, description="Pages (and sitemaps) larger than this are not downloaded: "
                               "a failure that keeps the stored version.")
    max_pages: int = Field(10_000, ge=1, description="Pages listed per source at most (sitemap or crawl); pages "
                           "past the limit are not listed, so their stored versions are removed.")
    max_depth: int = Field(20, ge=0, description="Crawl: links followed from the start page at most (0: the start "
                           "page alone).")
    keep_query: bool = Field(False, description="Crawl: keep query strings (`page?id=3`) as separate pages; off "
                             "drops them, so `page?sort=asc` is `page`.")
    use_lastmod: bool = Field(
        True, description="Sitemap: a page whose <lastmod> equals the one its last download was listed with is "
        "not requested at all (no conditional request either).")
    exclude: list[str] = Field(
        default_factory=lambda: ["*.css", "*.js", "*.png", "*.jpg", "*.jpeg", "*.gif", "*.svg", "*.ico", "*.woff",
                                 "*.woff2", "*.ttf", "*.zip", "*.gz", "*.tar", "*.mp4", "*.mp3"],
        description="Glob patterns of URL paths not read as pages (sitemap entries and crawled links).")


class KbConfig(_Section):
    data_dir: Path | str = Field(Path("data"), description="Where snapshots, state, stores and Prefect results "
                                 "live: a local folder, or an object-storage URL (s3://bucket/kb).")
    namespace: str = Field("default", description="Namespace ingested and searched when none is given.")
    sources: list[str] = Field(default_factory=list, description="Files and folders ingested when none are given; "
                               "an http(s) URL is a web source: a sitemap (`.../sitemap.xml`) or a start page to crawl.")
    convert: ConvertConfig = Field(default_factory=ConvertConfig)
    chunking: ChunkConfig = Field(default_factory=ChunkConfig)
    embedder: EmbedderConfig = Field(default_factory=AutoEmbedder)
    store: StoreConfig = Field(default_factory=StoreConfig)
    flow: FlowConfig = Field(default_factory=FlowConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    graph: GraphConfig = Field(default_factory=GraphConfig)
    deploy: DeployConfig = Field(default_factory=DeployConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    web: WebConfig = Field(default_factory=WebConfig)

    @field_validator("data_dir", mode="before")
    @classmethod
    def _local_path_or_url(cls, value):
        """A URL (or a UPath of one) stays a string (a Path would fold its '//'); anything else is a local Path."""
        if not isinstance(value, Path) and "://" in str(value):
            return str(value)
        return Path(value) if isinstance(value, str) else value

    @field_validator("namespace")
    @classmethod
    def _namespace_ok(cls, value: str) -> str:
        return check_namespace(value)


def check_namespace(name: str) -> str:
    if not NAMESPACE_RE.match(name):
        raise ConfigError(
            f"namespace {name!r} is invalid: use 1-64 letters, digits, '_' or '-', starting with a letter or digit"
        )
    return name


ENV_PREFIX = "KBFLOW__"


# Where each value of the raw mapping came from, keyed by its path there: "file PATH", "environment NAME" or
# "flag --NAME". A path missing from it holds its built-in default. (`kbflow config show` prints it.)
Origins = dict[tuple[str, ...], str]


def _set_origin(origins: Origins | None, path: tuple[str, ...], value: object, label: str) -> None:
    """Record ``label`` for every leaf of ``value`` set at ``path`` (a list is one leaf), dropping what the value
    replaced: an environment variable that sets a whole section replaces the file's values in it."""
    if origins is None:
        return
    for key in [key for key in origins if key[:len(path)] == path]:
        del origins[key]
    if isinstance(value, dict):
        for key, item in value.items():
            _set_origin(origins, (*path, str(key)), item, label)
    elif path:
        origins[path] = label


def _apply_env(raw: dict, environ, origins: Origins | None = None) -> None:
    """``KBFLOW__SECTION__FIELD=value`` sets ``section.field`` (any depth; the value is read as YAML, so ``128``,
    ``true`` and ``[a, b]`` keep their types). Names are matched case-insensitively; validation names a wrong one."""
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX) or len(name) == len(ENV_PREFIX):
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split("__")]
        if any(not part for part in path):
            raise ConfigError(f"environment variable {name} names no config field: use KBFLOW__SECTION__FIELD")
        try:
            value = yaml.safe_load(environ[name])
        except yaml.YAMLError as exc:
            raise ConfigError(f"environment variable {name} is not a valid YAML value: {exc}") from None
        target = raw
        for part in path[:-1]:
            if target.get(part) is None:  # absent, or an empty section in the file ("search:")
                target[part] = {}
            target = target[part]
            if not isinstance(target, dict):
                raise ConfigError(f"environment variable {name}: {part!r} is a value, not a section")
        target[path[-1]] = value
        _set_origin(origins, tuple(path), value, f"environment {name}")


def load_config(path: str | Path | None = None, **overrides: object) -> KbConfig:
    """Load a YAML config (or the defaults), apply environment overrides, then non-None keyword overrides, and
    validate once.

    ``KBFLOW_DATA_DIR`` in the environment overrides ``data_dir`` unless an explicit override is given;
    ``KBFLOW__SECTION__FIELD`` variables override single fields of the file (see ``_apply_env``).
    """
    return load_config_with_origins(path, **overrides)[0]


def load_config_with_origins(path: str | Path | None = None, **overrides: object) -> tuple[KbConfig, Origins]:
    """``load_config``, also returning where each value that is not a built-in default came from (``Origins``);
    a keyword override is labelled as the command-line flag that passes it (``data_dir``: ``flag --data-dir``)."""
    raw: dict = {}
    origins: Origins = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist: pass an existing YAML file to --config")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
        _set_origin(origins, (), raw, f"file {path}")
    if os.environ.get("KBFLOW_DATA_DIR") and overrides.get("data_dir") is None:
        raw["data_dir"] = os.environ["KBFLOW_DATA_DIR"]
        _set_origin(origins, ("data_dir",), raw["data_dir"], "environment KBFLOW_DATA_DIR")
    _apply_env(raw, os.environ, origins)
    for key, value in overrides.items():
        if value is not None:
            raw[key] = value
            _set_origin(origins, (key,), value, f"flag --{key.replace('_', '-')}")
    rank = {"file": 1, "environment": 2, "flag": 3}

    def later(path: tuple[str, ...]) -> int:
        return rank.get(origins.get(path, "").split(" ")[0], 0)

    raw["embedder"], moves = migrate_flat_keys(
        raw.get("embedder", {}), nested_wins=lambda key: later(("embedder", "connection", key)) > later(("embedder", key)))
    moves += _move_connection_keys(raw, later)
    for old, new in moves:  # a value keeps its source under its new name; a dropped or beaten one has none
        flat, nested = tuple(old.split(".")), tuple(new.split("."))
        flat_rank, label = later(flat), origins.pop(flat, None)
        if label and new and later(nested) <= flat_rank:
            origins[nested] = label
    try:
        return KbConfig.model_validate(raw), origins
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']} (got {err.get('input')!r})" for err in exc.errors()
        )
        where = f" in {str(path)!r}" if path else ""
        raise ConfigError(f"invalid configuration{where}: {problems}") from None
