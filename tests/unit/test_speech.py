"""The Whisper backend's packaged model (joined from two packages, checked against the pinned sha256), its
configuration errors and cache keys, and `kbflow bench speech` on a real recording."""

from __future__ import annotations

import json
import shutil

import pytest

from kbflow.config import ConvertConfig
from kbflow.convert.converters import format_fingerprint
from kbflow.convert.formats import whisper
from kbflow.core.errors import ConfigError
from tests.conftest import CASES


def test_the_packaged_model_is_joined_once_and_checked_against_its_pinned_hash(tmp_path, monkeypatch):
    monkeypatch.setenv(whisper.MODELS_DIR_ENV, str(tmp_path / "models"))
    folder = whisper.packaged_model_dir()
    assert folder == tmp_path / "models" / whisper.PACKAGED_NAME
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.bin", "tokenizer.json",
                                                        "vocabulary.txt"]
    assert folder.joinpath("model.bin").stat().st_size == 145_217_532
    assert sorted(p.name for p in folder.parent.iterdir()) == [whisper.PACKAGED_NAME]  # no staging left
    stamp = folder.joinpath("model.bin").stat().st_mtime_ns
    assert whisper.packaged_model_dir() == folder and folder.joinpath("model.bin").stat().st_mtime_ns == stamp

    shutil.rmtree(folder)
    monkeypatch.setattr(whisper, "PACKAGED_SHA256", "0" * 64)  # what a damaged or swapped part looks like
    with pytest.raises(ConfigError, match="do not match the sha256 kbflow pins.*reinstall"):
        whisper.packaged_model_dir()
    assert list((tmp_path / "models").iterdir()) == []  # nothing half-written is left to be trusted later


def test_an_unwritable_models_dir_names_the_variable_to_set(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(whisper.MODELS_DIR_ENV, str(blocker / "models"))
    with pytest.raises(ConfigError, match=whisper.MODELS_DIR_ENV):
        whisper.packaged_model_dir()


def test_model_folder_and_language_are_checked_and_in_the_cache_key(tmp_path):
    with pytest.raises(ConfigError, match="not a CTranslate2 Whisper model folder"):
        whisper.model_id(str(tmp_path))
    base = format_fingerprint(ConvertConfig(audio_backend="whisper"), "a.wav")
    assert whisper.PACKAGED_NAME in base and "lang=detect" in base
    assert format_fingerprint(ConvertConfig(audio_backend="whisper", whisper_language="zh"), "a.wav") != base
    custom = tmp_path / "small"
    custom.mkdir()
    (custom / "config.json").write_text("{}")
    (custom / "model.bin").write_bytes(b"x" * 10)
    assert "small-" in format_fingerprint(ConvertConfig(audio_backend="whisper", whisper_model_dir=str(custom)),
                                          "a.wav")
    assert format_fingerprint(ConvertConfig(audio_backend="whisper"), "a.pdf") == \
        format_fingerprint(ConvertConfig(audio_backend="pocketsphinx"), "a.pdf")  # only audio re-converts


def test_an_unknown_language_fails_the_file_with_the_fix():
    from kbflow.convert.converters import convert_bytes

    data = (CASES / "formats" / "conf-onlyperson.wav").read_bytes()
    with pytest.raises(Exception, match="not a Whisper language code"):
        convert_bytes(data, "a.wav", "a.wav", ConvertConfig(audio_backend="whisper", whisper_language="klingon"))


def test_bench_speech_compares_the_offline_backends_in_one_run(tmp_path):
    from kbflow.bench.speech import bench_speech

    audio = tmp_path / "audio"
    audio.mkdir()
    shutil.copy(CASES / "formats" / "conf-onlyperson.wav", audio)
    (audio / "transcripts.txt").write_text((CASES / "formats" / "conf-onlyperson.txt").read_text())
    result = bench_speech(audio, tmp_path / "out" / "speech.json")
    runs = result["backends"]
    assert list(runs) == ["whisper", "pocketsphinx"]
    assert runs["whisper"]["corpus_wer"] < runs["pocketsphinx"]["corpus_wer"]
    assert all(run["wall_s_per_audio_minute"] > 0 and run["files"]["conf-onlyperson.wav"]["words"] == 9
               for run in runs.values())
    assert json.loads((tmp_path / "out" / "speech.json").read_text())["files"] == 1
    assert (tmp_path / "out" / "speech.png").stat().st_size > 1000
    (audio / "transcripts.txt").write_text("missing: some words\n")
    with pytest.raises(ConfigError, match="no audio file of that name"):
        bench_speech(audio, tmp_path / "out" / "speech.json")
