"""How deployed flow runs meet each other: one writing run per namespace at a time (queued, not failed), and a
partial request completed from the deployment's own.

* The engine's namespace lock refuses a second writer at once, which is right for a terminal but wrong for a
  schedule that meets a manual run. Flow runs therefore first take a slot of a Prefect global concurrency limit
  of 1 per namespace and data dir (``kbflow:<namespace>@<data dir hash>``, created on first use): the second run
  waits in the UI until the first is done, then runs. Dry runs only read and do not queue.
* Prefect merges a run's parameters with the deployment's at the top level only, so ``{"request": {"dry_run":
  true}}`` would replace the served request whole (its config included). A request is therefore completed from
  the deployment's own: the fields the caller set win, the rest come from the deployment.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel


def namespace_limit_name(data_dir: str | Path, namespace: str) -> str:
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:8]
    return f"kbflow:{namespace}@{digest}"


@contextmanager
def one_run_per_namespace(data_dir: str | Path, namespace: str):
    """Hold the namespace's slot for the block, waiting for it as long as another flow run holds it."""
    from prefect import get_client
    from prefect.concurrency.sync import concurrency

    name = namespace_limit_name(data_dir, namespace)
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, limit=1)
    with concurrency(name, occupy=1, strict=True):
        yield


def completed_from_deployment(request: BaseModel, parameter: str = "request") -> BaseModel:
    """``request`` with the fields its caller did not set taken from the deployment's own ``parameter`` (nothing
    changes outside a deployment run)."""
    from prefect import get_client
    from prefect.runtime import deployment

    if not deployment.id:
        return request
    with get_client(sync_client=True) as client:
        served = (client.read_deployment(deployment.id).parameters or {}).get(parameter) or {}
    given = request.model_dump(mode="json", include=request.model_fields_set)
    return type(request).model_validate({**served, **given})
