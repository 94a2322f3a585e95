"""One writer per namespace on object storage (issue 19.2): the lease object of state/object_lock.py against a real
S3 endpoint on 127.0.0.1 (moto's server) through s3fs, racing real threads."""

from __future__ import annotations

import json
import threading
import time

import pytest

from kbflow.core.errors import ConfigError
from kbflow.state.lock import NamespaceLocked
from kbflow.state.object_lock import ObjectLock

pytest.importorskip("moto.server")
# seconds: a holder renews every LEASE / 3; under a loaded CI machine (2 cores, two test workers, the S3 server in
# the same process) a 1 s lease missed its renewals by a few hundred ms once, and check() rightly refused
LEASE = 2.0


def test_one_run_holds_the_lease_and_the_next_takes_it_after_release(s3):
    client, bucket = s3
    first, second = ObjectLock(f"s3://{bucket}/kb/state/ns", "ns"), ObjectLock(f"s3://{bucket}/kb/state/ns", "ns")
    with first:
        with pytest.raises(NamespaceLocked, match=r"namespace 'ns' is being ingested by pid \d+ on .* wait for it"):
            second.acquire()
        first.check()
        holder = json.loads(client.get_object(Bucket=bucket, Key="kb/state/ns/ingest.lock")["Body"].read())
        assert holder["owner"] == first.owner["owner"]
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="kb/state/ns/")
    with second:
        second.check()


def test_of_many_racing_runs_exactly_one_takes_the_lease(s3):
    _, bucket = s3
    locks = [ObjectLock(f"s3://{bucket}/state/ns", "ns") for _ in range(8)]
    start, won, refused = threading.Barrier(len(locks)), [], []

    def race(lock):
        start.wait()
        try:
            lock.acquire()
            won.append(lock)
        except NamespaceLocked:
            refused.append(lock)

    threads = [threading.Thread(target=race, args=(lock,)) for lock in locks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == 7
    won[0].release()


def test_a_renewed_lease_is_kept_and_a_dead_runs_lease_is_taken_over(s3):
    client, bucket = s3
    url = f"s3://{bucket}/state/ns"
    alive = ObjectLock(url, "ns", lease_s=LEASE)
    alive.acquire()
    time.sleep(2 * LEASE + 1.5)  # past twice the lease: only the renewals keep it
    with pytest.raises(NamespaceLocked, match="being ingested"):
        ObjectLock(url, "ns", lease_s=LEASE).acquire()
    alive.check()

    alive._stop.set()  # the holder dies: no more renewals, no release
    alive._renewer.join()
    time.sleep(2 * LEASE + 1.5)  # over twice the lease even as the store's whole seconds count it
    with pytest.raises(NamespaceLocked, match="last renewed"):
        alive.check()  # the stalled run stops before writing: another may take over now
    taker = ObjectLock(url, "ns", lease_s=LEASE)
    taker.acquire()
    alive.release()  # the stalled run coming back does not delete the new holder's lease
    holder = json.loads(client.get_object(Bucket=bucket, Key="state/ns/ingest.lock")["Body"].read())
    assert holder["owner"] == taker.owner["owner"]
    taker.check()
    taker.release()


def test_a_run_taken_over_while_stalled_knows_it(s3):
    _, bucket = s3
    url = f"s3://{bucket}/state/ns"
    stalled = ObjectLock(url, "ns", lease_s=LEASE)
    stalled.acquire()
    with stalled._mutex:  # stalled: holds up its own renewals past twice the lease
        time.sleep(2 * LEASE + 1.5)
        taker = ObjectLock(url, "ns", lease_s=LEASE)
        taker.acquire()
    time.sleep(LEASE)  # its next renewal is refused: the lease is not its own any more
    with pytest.raises(NamespaceLocked, match="another run took over"):
        stalled.check()
    stalled.release()
    taker.check()
    taker.release()


def test_a_lock_outside_s3_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="S3 conditional writes"):
        ObjectLock("memory://kb/state/ns", "ns")


def test_a_lease_whose_holder_died_on_this_host_is_taken_over_at_once(s3):
    """A crash re-run on the same machine does not wait out the lease (as with the local lock file); a lease held
    from another host is waited out, whatever its pid means here."""
    import socket
    import subprocess

    client, bucket = s3
    dead = subprocess.Popen(["true"])
    dead.wait()
    lease = {"owner": "crashed", "pid": dead.pid, "started": time.time(), "lease_s": 60.0}
    client.put_object(Bucket=bucket, Key="state/ns/ingest.lock",
                      Body=json.dumps({**lease, "host": "another-host"}).encode())
    with pytest.raises(NamespaceLocked, match="another-host"):
        ObjectLock(f"s3://{bucket}/state/ns", "ns").acquire()
    client.put_object(Bucket=bucket, Key="state/ns/ingest.lock",
                      Body=json.dumps({**lease, "host": socket.gethostname()}).encode())
    with ObjectLock(f"s3://{bucket}/state/ns", "ns") as lock:
        holder = json.loads(client.get_object(Bucket=bucket, Key="state/ns/ingest.lock")["Body"].read())
        assert holder["owner"] == lock.owner["owner"]
