"""Operations on a knowledge base beside ingest and search: ``verify`` (find and heal damage), ``prune`` (old
versions and caches), ``deploy`` (what a served Prefect deployment accepts from a Run form or CI) and ``report``
(the text of a run's summary and artifacts)."""
