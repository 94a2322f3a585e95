"""The namespace's run slot (a Prefect global concurrency limit held with a lease) on the session's real Prefect
test server: held for the block, its holder recorded, released after; a failed release never hides the run's own
outcome."""

from __future__ import annotations

import json
import logging

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
