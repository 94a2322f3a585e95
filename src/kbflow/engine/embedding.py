"""Embed with the cache: the one loop ingest and reembed both use.

Every text is keyed by ``embed_sha256`` (the exact text the model reads); the vector cache is asked for all keys
at once, and only the misses are embedded, in stage calls of ``embedder.task_batch`` texts, at most
``max_in_flight`` at a time. A stage call that fails is not the end of its texts: whatever of it reached the cache
before the failure is used (and counted as embedded, since the provider was paid for it); only texts with no
vector are reported failed, with the error and its attempts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np

from kbflow.embed.base import Embedder
from kbflow.engine import stages
from kbflow.engine.runner import StageRunner, call
from kbflow.core.errors import AuthError
from kbflow.runtime.failpoints import failpoint
from kbflow.stores.vector_cache import VectorCache

log = logging.getLogger("kbflow.engine")


@dataclass
class EmbedFailure:
    keys: list[str]  # texts left without a vector
    error: BaseException
    attempts: int


@dataclass
class EmbedOutcome:
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    embedded: int = 0  # texts embedded by the model in this call (what a provider bills)
    reused: int = 0  # texts whose vector came from the cache
    failures: list[EmbedFailure] = field(default_factory=list)
    auth_refused: BaseException | None = None  # the key was refused: the caller sends nothing more this run

    @property
    def failed_keys(self) -> set[str]:
        return {key for failure in self.failures for key in failure.keys}


def embed_with_cache(keys: list[str], texts: list[str], embedder: Embedder, cache: VectorCache, runner: StageRunner,
                     task_batch: int, max_in_flight: int, label: str = "texts",
                     on_progress: Callable[[int, int], None] | None = None,
                     refused: BaseException | None = None,
                     cached: dict[str, np.ndarray] | None = None) -> EmbedOutcome:
    """Vectors for ``keys`` (unique), reusing cached ones. ``refused``: a key refusal met earlier in this run;
    then nothing is sent and every miss is reported failed with it. ``cached``: the caller has just looked ``keys``
    up in the cache and these are the vectors it found (the cache is not read again); None: look them up here."""
    outcome = EmbedOutcome(auth_refused=refused)
    outcome.vectors = dict(cached) if cached is not None else cache.lookup(keys)
    missing = [(key, text) for key, text in zip(keys, texts) if key not in outcome.vectors]
    outcome.reused = len(keys) - len(missing)
    parts = [missing[start:start + task_batch] for start in range(0, len(missing), task_batch)]
    if refused is not None:
        outcome.failures = [EmbedFailure([key for key, _ in part], refused, 0) for part in parts]
        return outcome

    def submit(index: int):
        part = parts[index]
        first = index * task_batch
        # known_missing: the lookup above found none of the part; a retry of the call looks again (its first try
        # may have cached some before it failed)
        return runner.submit(call(stages.embed, [key for key, _ in part], [text for _, text in part], embedder, cache,
                                  known_missing=True), label=f"{label} {first}-{first + len(part) - 1}")

    in_flight = {index: submit(index) for index in range(min(max_in_flight, len(parts)))}
    done = 0
    for index, part in enumerate(parts):
        part_keys = [key for key, _ in part]
        future = in_flight.pop(index, None)
        if future is None:  # the key was refused by an earlier part: the provider would refuse this one too
            assert outcome.auth_refused is not None  # the only reason a part is not submitted
            outcome.failures.append(EmbedFailure(part_keys, outcome.auth_refused, 0))
            continue
        try:
            returned_keys, matrix = future.result()
            outcome.vectors.update(zip(returned_keys, matrix))
            outcome.embedded += len(part)
            failpoint("embed.batch_done")  # this part's vectors are in the cache; later parts are not
        except Exception as exc:  # what reached the cache before the failure is kept; the rest is reported
            saved = cache.lookup(part_keys)
            outcome.vectors.update(saved)
            outcome.embedded += len(saved)
            lost = [key for key in part_keys if key not in saved]
            if lost:
                outcome.failures.append(EmbedFailure(lost, exc, getattr(exc, "attempts", 1)))
            if isinstance(exc, AuthError) and outcome.auth_refused is None:
                outcome.auth_refused = exc
                log.error("embedding stopped: %s", exc)
        if index + max_in_flight < len(parts) and outcome.auth_refused is None:
            in_flight[index + max_in_flight] = submit(index + max_in_flight)
        done += len(part)
        if on_progress is not None:
            on_progress(done, len(missing))
    return outcome
