"""The namespace's run slot (a Prefect global concurrency limit held with a lease) on the session's real Prefect
test server: held for the block, its holder recorded, released after; a failed release never hides the run's own
outcome."""

from __future__ import annotations

import json
import logging
import time

import pytest
from prefect import get_client
from prefect.client.orchestration import SyncPrefectClient

from kbflow.tasks.runs import holder_file, namespace_limit_name, one_run_per_namespace


def _active_slots(name: str) -> int:
    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name).active_slots


def test_the_slot_is_held_recorded_and_released(tmp_path):
    name = namespace_limit_name(tmp_path, "slots")
    with one_run_per_namespace(tmp_path, "slots"):
        assert _active_slots(name) == 1
        assert json.loads(holder_file(tmp_path, "slots").read_text())["lease_id"]
    assert _active_slots(name) == 0 and not holder_file(tmp_path, "slots").exists()


def test_a_failed_release_is_logged_and_the_runs_own_error_still_raised(tmp_path, monkeypatch, caplog):
    def unreachable(self, lease_id):
        raise ConnectionError("server went away")

    monkeypatch.setattr(SyncPrefectClient, "release_concurrency_slots_with_lease", unreachable)
    with caplog.at_level(logging.WARNING, logger="kbflow.engine"), pytest.raises(ValueError, match="the run's own"):
        with one_run_per_namespace(tmp_path, "gone"):
            raise ValueError("the run's own error")
    assert "could not release namespace gone's run slot" in caplog.text and "server went away" in caplog.text
    with caplog.at_level(logging.WARNING, logger="kbflow.engine"):
        with one_run_per_namespace(tmp_path, "gone2"):
            pass  # a run that succeeded is not turned into a failure by the release either


def test_the_lease_is_renewed_on_the_server_the_run_reports_to(tmp_path, monkeypatch, caplog):
    """The renewals come from a thread of their own; they reach the server this run's settings name (the test
    server here, a process's temporary server for a library caller), not a server Prefect would start for a thread
    whose context has no API URL, where every renewal would miss the lease and it would run out under a long run."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import kbflow.tasks.runs as runs

    renewed_at: list[str] = []
    renew = SyncPrefectClient.renew_concurrency_lease

    def recorded(self, lease_id, lease_duration):
        renewed_at.append(str(self.api_url).rstrip("/"))
        return renew(self, lease_id, lease_duration)

    monkeypatch.setattr(SyncPrefectClient, "renew_concurrency_lease", recorded)
    monkeypatch.setattr(runs, "RENEW_S", 0.3)
    # the run names the test server by another spelling of its address, in its own settings only (as
    # kbflow.tasks.server does for a temporary server): renewals that lost the run's settings would go by the
    # process-wide server's spelling, or start a server of Prefect's own
    url = PREFECT_API_URL.value().replace("127.0.0.1", "localhost")
    assert url != PREFECT_API_URL.value()
    servers_before = set(SubprocessASGIServer._instances)
    with caplog.at_level(logging.WARNING, logger="kbflow.engine"), temporary_settings(updates={PREFECT_API_URL: url}):
        with one_run_per_namespace(tmp_path, "renewed"):
            deadline = time.monotonic() + 30
            while len(renewed_at) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
    assert len(renewed_at) >= 2 and set(renewed_at) == {url.rstrip("/")}
    assert "could not renew" not in caplog.text
    assert set(SubprocessASGIServer._instances) == servers_before  # no server of Prefect's own was started


def test_two_runs_of_a_new_namespace_that_start_together_both_get_its_limit(tmp_path, monkeypatch):
    """Prefect's upsert of a limit reads, then creates. The race, made certain: this run's read answers 'not found'
    (the other run has not created the limit yet), then the other run creates it, then this run's create is
    refused by the real server. The run must still take its slot."""
    from prefect.exceptions import ObjectNotFound

    name = namespace_limit_name(tmp_path, "raced")
    read = SyncPrefectClient.read_global_concurrency_limit_by_name
    raced = []

    def read_before_the_other_run_created_it(self, limit_name):
        if limit_name == name and not raced:
            raced.append(True)
            with get_client(sync_client=True) as other_run:
                other_run.upsert_global_concurrency_limit_by_name(name, limit=1)
            raise ObjectNotFound(None, f"limit {limit_name} not found")
        return read(self, limit_name)

    monkeypatch.setattr(SyncPrefectClient, "read_global_concurrency_limit_by_name",
                        read_before_the_other_run_created_it)
    with one_run_per_namespace(tmp_path, "raced"):
        assert raced and _active_slots(name) == 1
    assert _active_slots(name) == 0
