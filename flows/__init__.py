"""Prefect flows over the engine (installed as ``kbflow.flows``): ingest, ingest_request, backfill, reembed, and
the deployments ``kbflow serve`` registers. Composition only."""
