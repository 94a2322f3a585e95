"""Vector stores behind one interface: replace a batch of documents, delete, search, count, stats, clear."""

from kbflow.stores.base import Hit, SearchFilter, Store
from kbflow.stores.factory import open_store

__all__ = ["Hit", "SearchFilter", "Store", "open_store"]
