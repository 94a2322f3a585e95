"""kbflow: documents in, an incremental, searchable knowledge base out.

All pipeline logic lives in this package (``kbflow.engine`` and its stages) and never imports Prefect;
``kbflow.tasks`` and ``kbflow.flows`` (the repository's ``tasks/`` and ``flows/`` folders, installed into this
package) wrap it as cached, retryable Prefect tasks and flows.
"""

import logging
import os

__version__ = "0.1.0"

# An ingest runs the model's two threads beside conversion processes, chunking and writes on the same cores. By
# default the model's OpenMP threads spin between operations and the tokenizer starts a thread pool of its own,
# both taking CPU the rest of the run needs: with these two set, the PostgreSQL manual ingested in 271.4 s instead
# of 333.4 s (docs/benchmarks.md, e5 in bf16 on 2 cores). They must be set before torch loads its OpenMP runtime,
# so here; a value already in the environment is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# a library does not print: the engine's log lines reach whoever configures logging (the CLI prints its own
# summary; inside a Prefect flow run they go to the run's logs)
logging.getLogger("kbflow").addHandler(logging.NullHandler())


def __getattr__(name: str):
    """``from kbflow import KnowledgeBase`` without importing the stores for ``import kbflow``."""
    if name == "KnowledgeBase":
        from kbflow.kb import KnowledgeBase

        return KnowledgeBase
    raise AttributeError(f"module 'kbflow' has no attribute {name!r}")
