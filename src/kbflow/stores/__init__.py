"""Vector stores behind one interface: replace a batch of documents, delete, search, count, stats, clear."""

from kbflow.stores.base import Hit, Store
from kbflow.stores.factory import open_store

__all__ = ["Hit", "Store", "open_store"]
