"""Embedding backends behind one interface, and the vector cache keyed by (text sha256, model id)."""

from kbflow.embed.base import Embedder, check_vectors
from kbflow.embed.factory import get_embedder

__all__ = ["Embedder", "check_vectors", "get_embedder"]
