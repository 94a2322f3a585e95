"""Prefect tasks around the engine's stages (installed as ``kbflow.tasks``): cache keys, retries, run names,
artifacts, task runners. No pipeline logic."""
