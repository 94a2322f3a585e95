"""The engine: one ingest run and one reembed run, which every entry point executes (the CLI, the Python API,
``KnowledgeBase``, and the Prefect flows in ``kbflow.flows``). Never imports Prefect.

* ``ingest``: scan → plan → per batch convert → split → chunk → embed-with-cache → upsert → manifest; deletions;
  indexes; the run summary and its failure snapshot.
* ``reembed``: a namespace's stored chunks through the same embed-with-cache loop into a new table.
* ``stages``: the stage functions and their retry policies; ``runner``: how a stage is run (``DirectRunner`` here,
  ``kbflow.tasks.PrefectRunner`` in a flow run); ``plan``/``rows``: pure table logic.
"""
