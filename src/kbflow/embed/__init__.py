"""Embedding backends behind one interface, and the vector cache keyed by (text sha256, model id).

Write side: ``embedder.embed_documents(texts)`` (alias ``embed_passages``). Read side: ``embedder.embed_query(text)``
or ``embedder.embed_queries(texts)``, which apply the backend's query prefix / text_type.
"""

from kbflow.embed.base import Embedder, check_vectors
from kbflow.embed.factory import get_embedder

__all__ = ["Embedder", "check_vectors", "get_embedder"]
