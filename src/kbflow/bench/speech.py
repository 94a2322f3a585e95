"""`kbflow bench speech`: the offline speech backends side by side on recordings with reference transcripts.

A folder of audio files and a ``transcripts.txt`` of ``stem: text`` lines (the layout of the shared corpus's
``mixed/audio``). Every backend transcribes every file in this one process (one run, so the ratios hold on a
noisy machine): word error rate per file and over the corpus (errors summed over files), character error rate
for references without Latin words (Chinese), seconds per minute of audio (CPU and wall), and apart from them the
first call (loading the model, the first time also joining the packaged Whisper weights, and the first file). Text in parentheses in a reference is a stage direction, not speech, and is not scored.
"""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path

from kbflow.bench.results import panels, save
from kbflow.config import ConvertConfig
from kbflow.convert.formats.audio import AUDIO_SUFFIXES, audio_fingerprint, pcm16_mono, transcribe
from kbflow.core.errors import ConfigError
from kbflow.bench.textmetrics import cer, edit_distance, normalize_chars, word_errors

OFFLINE_BACKENDS = ("whisper", "pocketsphinx")


def references(folder: Path) -> dict[Path, str]:
    listing = folder / "transcripts.txt"
    if not folder.is_dir() or not listing.is_file():
        raise ConfigError(f"--audio {str(folder)!r} must be a folder holding audio files and a transcripts.txt of "
                          "'stem: text' lines")
    found = {}
    for line in listing.read_text(encoding="utf-8").splitlines():
        stem, sep, text = line.partition(":")
        if not sep:
            continue
        audio = next((p for p in sorted(folder.iterdir()) if p.stem == stem.strip()
                      and p.suffix.lower() in AUDIO_SUFFIXES), None)
        if audio is None:
            raise ConfigError(f"transcripts.txt names {stem.strip()!r}, but no audio file of that name is in "
                              f"{str(folder)!r}")
        found[audio] = re.sub(r"\([^)]*\)", " ", text).strip()
    if not found:
        raise ConfigError(f"{str(listing)!r} lists no 'stem: text' line")
    return found


def _is_chinese(text: str) -> bool:
    return bool(re.search(r"[\u4e00-\u9fff]", text)) and not re.search(r"[A-Za-z]{2,}", text)


def bench_speech(audio: Path, out_file: Path, backends: list[str] | None = None) -> dict:
    backends = list(backends or OFFLINE_BACKENDS)
    unknown = [name for name in backends if name not in OFFLINE_BACKENDS]
    if unknown:
        raise ConfigError(f"--backend {unknown}: bench speech compares the offline backends {OFFLINE_BACKENDS}")
    refs = references(Path(audio))
    minutes = sum(len(pcm16_mono(path.read_bytes(), path.name)) for path in refs) / 16000 / 60
    by_backend: dict[str, dict] = {}
    result = {"audio": str(audio), "files": len(refs), "audio_minutes": round(minutes, 3),
              "machine": f"{platform.machine()}, {platform.python_version()}", "backends": by_backend}
    for backend in backends:
        options = ConvertConfig(audio_backend=backend)
        warm = next(iter(refs))
        started = time.perf_counter()
        transcribe(warm.read_bytes(), warm.name, warm.suffix, options)  # loads the model; timed apart
        first_call_s = time.perf_counter() - started
        files, errors, words, char_errors, chars, wall, cpu = {}, 0, 0, 0, 0, 0.0, 0.0
        for path, reference in refs.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            hypothesis, _ = transcribe(path.read_bytes(), path.name, path.suffix, options)
            wall += time.perf_counter() - started
            cpu += time.process_time() - cpu_started
            entry: dict[str, object] = {"hypothesis": hypothesis}
            if _is_chinese(reference):
                ref, hyp = normalize_chars(reference).replace(" ", ""), normalize_chars(hypothesis).replace(" ", "")
                entry["cer"] = round(cer(ref, hyp), 4)
                char_errors, chars = char_errors + edit_distance(ref, hyp), chars + len(ref)
            else:
                e, n = word_errors(reference, hypothesis)
                entry.update(wer=round(e / max(n, 1), 4), words=n)
                errors, words = errors + e, words + n
            files[path.name] = entry
        by_backend[backend] = {
            "fingerprint": audio_fingerprint(options), "first_call_s": round(first_call_s, 2),
            "corpus_wer": round(errors / words, 4) if words else None,
            "corpus_cer": round(char_errors / chars, 4) if chars else None,
            "wall_s_per_audio_minute": round(wall / minutes, 2), "cpu_s_per_audio_minute": round(cpu / minutes, 2),
            "files": files,
        }
    return save(result, out_file, plot)


def plot(result: dict, png: Path) -> Path:
    names = list(result["backends"])
    runs = [result["backends"][name] for name in names]
    with panels(png) as (_figure, (left, right)):
        left.bar(names, [run["corpus_wer"] or 0 for run in runs], color="#4c72b0")
        left.set_ylabel("word error rate (corpus)")
        left.set_title(f"{result['files']} recordings, {result['audio_minutes']:.1f} min")
        right.bar(names, [run["wall_s_per_audio_minute"] for run in runs], color="#55a868", label="wall")
        right.bar(names, [run["cpu_s_per_audio_minute"] for run in runs], color="none", edgecolor="black",
                  label="CPU")
        right.set_ylabel("seconds per minute of audio")
        right.legend()
    return png
