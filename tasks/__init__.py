"""Prefect tasks around the engine's stages (installed as ``kbflow.tasks``): cache keys, retries, run names,
artifacts, task runners. No pipeline logic."""

from kbflow.runtime.environment import set_quiet_offline_defaults

# a flow entry point (every flow imports its tasks): offline models and Prefect's logging defaults, before the
# tasks run; importing the kbflow library itself sets no environment variables
set_quiet_offline_defaults()
