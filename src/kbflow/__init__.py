"""kbflow: documents in, an incremental, searchable knowledge base out.

All pipeline logic lives in this package and never imports Prefect; ``tasks/``
and ``flows/`` at the repository root wrap it as cached, retryable Prefect tasks.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``from kbflow import KnowledgeBase`` without importing the stores for ``import kbflow``."""
    if name == "KnowledgeBase":
        from kbflow.kb import KnowledgeBase

        return KnowledgeBase
    raise AttributeError(f"module 'kbflow' has no attribute {name!r}")
