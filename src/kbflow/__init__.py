"""kbflow: documents in, an incremental, searchable knowledge base out.

All pipeline logic lives in this package and never imports Prefect; ``tasks/``
and ``flows/`` at the repository root wrap it as cached, retryable Prefect tasks.
"""

__version__ = "0.1.0"
