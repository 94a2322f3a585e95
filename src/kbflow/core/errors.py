"""One error hierarchy. Retries are driven by the class, never by message text."""

from __future__ import annotations

from contextvars import ContextVar


class KbflowError(Exception):
    """Base of every error kbflow raises on purpose. Messages quote the bad value and name the fix."""

    transient = False


class TransientError(KbflowError):
    """Worth retrying: timeouts, connection resets, HTTP 429 and 5xx."""

    transient = True

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(KbflowError):
    """Retrying cannot help: bad input, bad key, wrong dimension."""


class AuthError(PermanentError):
    """A remote service refused the API key (HTTP 401/403): every other request would be refused too."""


class StoreBusy(TransientError):
    """A store or file-system operation met a passing condition (a concurrent commit, a busy or locked file, a
    network file system or object store timing out); the stage is retried."""


class ConfigError(PermanentError):
    """The configuration is invalid; the message names the field and the fix."""


class LlmNotConfigured(ConfigError):
    """No chat model is configured (no endpoint or key in the environment, no local model file): ask, agentic
    ask, mqe and hyde cannot run."""


class ConversionError(PermanentError):
    """A source file could not be turned into Markdown."""


class WorkerStartError(PermanentError):
    """A worker process (conversion) exited or hung before it was ready; retrying would only start it again."""


class EmbeddingError(PermanentError):
    """The embedder returned something unusable (wrong shape, NaN, zero vector)."""


class ModelMismatchError(PermanentError):
    """A namespace was created with one embedding model and is used with another."""


class StateDamaged(PermanentError):
    """A state file, a folder of the data dir or a store table is there but cannot be read; the message names it and
    the command that heals it (``kbflow verify --repair``)."""

    def __init__(self, message: str, path: str = "", namespace: str = ""):
        super().__init__(message)
        self.path = path
        self.namespace = namespace


class AccessDenied(PermanentError):
    """A file or folder kbflow must read or write is not accessible to this user; the message names it and the
    command that gives it back."""


# the local data dir the current call works in (set where a config is resolved): an AccessDenied whose library
# error named no path names the first unreadable one under it
DATA_DIR_IN_USE: ContextVar[str | None] = ContextVar("kbflow_data_dir_in_use", default=None)


class DeletionGuardError(PermanentError):
    """A run would delete more of a namespace than the configured share allows."""


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or the error it wraps) is marked transient."""
    error: BaseException | None = exc
    while error is not None:
        if isinstance(error, KbflowError):
            return error.transient
        error = error.__cause__
    return False
