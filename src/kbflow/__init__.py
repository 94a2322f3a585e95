"""kbflow: documents in, an incremental, searchable knowledge base out.

All pipeline logic lives in this package (``kbflow.engine`` and its stages) and never imports Prefect;
``kbflow.tasks`` and ``kbflow.flows`` (the repository's ``tasks/`` and ``flows/`` folders, installed into this
package) wrap it as cached, retryable Prefect tasks and flows.
"""

import logging

__version__ = "0.1.0"

# a library does not print: the engine's log lines reach whoever configures logging (the CLI prints its own
# summary; inside a Prefect flow run they go to the run's logs)
logging.getLogger("kbflow").addHandler(logging.NullHandler())


def __getattr__(name: str):
    """``from kbflow import KnowledgeBase`` without importing the stores for ``import kbflow``."""
    if name == "KnowledgeBase":
        from kbflow.kb import KnowledgeBase

        return KnowledgeBase
    raise AttributeError(f"module 'kbflow' has no attribute {name!r}")
