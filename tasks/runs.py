"""How deployed flow runs meet each other: one writing run per namespace at a time (queued, not failed), and a
partial request completed from the deployment's own.

* The engine's namespace lock refuses a second writer at once, which is right for a terminal but wrong for a
  schedule that meets a manual run. Flow runs therefore first take a slot of a Prefect global concurrency limit
  of 1 per namespace and data dir (``kbflow:<namespace>@<data dir hash>``, created on first use): the second run
  waits in the UI until the first is done, then runs. Dry runs only read and do not queue. The slot is a lease
  (renewed every ``RENEW_S`` while the run lives, from a thread that carries the run's Prefect settings: a thread's
  own context would have no API URL under a temporary or test server, and Prefect would start a server of its own
  for the renewals) and the holder records it beside the namespace lock; a run
  killed on this host (kill -9, out of memory) therefore blocks nobody: the next run sees its holder's process is
  gone and releases the slot at once, as the engine takes over its lock. A holder on another host is waited for
  until its lease runs out (``LEASE_S``, then the server's repossessor service frees it).
* Prefect merges a run's parameters with the deployment's at the top level only, so ``{"request": {"dry_run":
  true}}`` would replace the served request whole (its config included). A request is therefore completed from
  the deployment's own: the fields the caller set win, the rest come from the deployment.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

from pydantic import BaseModel

from kbflow.state.holders import alive
from kbflow.core.storage import is_remote, location, write_bytes_atomic

LEASE_S = 60.0  # how long a slot outlives a holder that stopped renewing it (a process on another host that died)
RENEW_S = LEASE_S / 3  # how often a holder renews its slot's lease
POLL_S = 2.0  # how often a waiting run asks for the slot again (and looks whether its holder died)


def namespace_limit_name(data_dir: str | Path, namespace: str) -> str:
    where = location(data_dir)
    digest = hashlib.sha256(str(where if is_remote(where) else where.resolve()).encode()).hexdigest()[:8]
    return f"kbflow:{namespace}@{digest}"


def holder_file(data_dir: str | Path, namespace: str):
    """Who holds the namespace's slot: lease id, pid, host (beside the engine's ingest.lock)."""
    return location(data_dir) / "state" / namespace / "queue-slot.json"


def _release_if_holder_died(client, record) -> bool:
    """Release the slot of a holder that died on this host; True if it did."""
    try:
        holder = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if holder.get("host") != socket.gethostname() or alive(int(holder.get("pid", 0))):
        return False
    try:
        client.release_concurrency_slots_with_lease(holder["lease_id"])
    except Exception as exc:  # already released or expired: nothing to free
        if getattr(getattr(exc, "response", None), "status_code", None) != 404:
            raise
    try:  # unless a new holder wrote its own record meanwhile
        if json.loads(record.read_text(encoding="utf-8")).get("lease_id") == holder["lease_id"]:
            record.unlink()
    except (OSError, ValueError):
        pass
    return True


def _acquire(client, name: str, record) -> str:
    """Wait for the slot (releasing it from a holder that died) and return its lease id."""
    import httpx
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.runtime import flow_run

    holder = ConcurrencyLeaseHolder(type="flow_run", id=flow_run.id) if flow_run.id else None
    while True:
        try:
            response = client.increment_concurrency_slots_with_lease(
                names=[name], slots=1, mode="concurrency", lease_duration=LEASE_S, holder=holder)
            return response.json()["lease_id"]
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 423:  # 423 Locked: another run holds it
                raise
        if not _release_if_holder_died(client, record):
            time.sleep(POLL_S)


def _renew_until(stop: threading.Event, lease_id: str) -> None:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        while not stop.wait(RENEW_S):
            try:
                client.renew_concurrency_lease(UUID(lease_id), lease_duration=LEASE_S)
            except Exception as exc:  # a blip: the next renewal, well inside the lease, tries again; said, not hidden
                logging.getLogger("kbflow.engine").warning(
                    "could not renew the namespace's queue slot (lease %s): %s; if this goes on past %g s another "
                    "run of the namespace may start and will then wait on the namespace lock", lease_id, exc, LEASE_S)


def _ensure_limit(client, name: str) -> None:
    """The namespace's limit of 1, created on first use. Prefect's upsert reads, then creates: two runs of a new
    namespace that start together both read nothing, and the second create is refused (ObjectAlreadyExists) with
    the limit now there, so it is upserted again, which then finds it."""
    from prefect.exceptions import ObjectAlreadyExists

    try:
        client.upsert_global_concurrency_limit_by_name(name, limit=1)
    except ObjectAlreadyExists:
        client.upsert_global_concurrency_limit_by_name(name, limit=1)


@contextmanager
def one_run_per_namespace(data_dir: str | Path, namespace: str):
    """Hold the namespace's slot for the block, waiting for it as long as another live flow run holds it."""
    from prefect import get_client

    name = namespace_limit_name(data_dir, namespace)
    record = holder_file(data_dir, namespace)
    with get_client(sync_client=True) as client:
        _ensure_limit(client, name)
        lease_id = _acquire(client, name, record)
    write_bytes_atomic(record, json.dumps({"lease_id": lease_id, "pid": os.getpid(), "host": socket.gethostname(),
                                           "started": time.time()}).encode("utf-8"), durable=False)
    stop = threading.Event()
    renewer = threading.Thread(target=contextvars.copy_context().run, args=(_renew_until, stop, lease_id),
                               name="kbflow-slot-lease", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join(timeout=5)
        if record.exists():
            record.unlink()
        try:
            with get_client(sync_client=True) as client:
                client.release_concurrency_slots_with_lease(UUID(lease_id))
        except Exception as exc:  # noqa: BLE001 - never hide the run's own outcome behind a failed release
            logging.getLogger("kbflow.engine").warning(
                "could not release namespace %s's run slot %s (%s: %s); its lease runs out within %.0f s and the "
                "next run of the namespace waits until then", namespace, name, type(exc).__name__, exc, LEASE_S)


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
