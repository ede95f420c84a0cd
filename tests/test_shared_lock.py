"""The lock elastic cores share: exclusive across processes and threads, freed when its holder dies."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading
import time

from streamrl.placement.shared_lock import SharedLock

FORK = mp.get_context("fork")


def _add_under_lock(lock: SharedLock, value, n: int) -> None:
    for _ in range(n):
        with lock:
            v = value.value
            time.sleep(0.0005)  # a read-modify-write with a window another holder would race into
            value.value = v + 1


def test_processes_and_threads_each_hold_it_alone():
    """Two forked processes and two threads of this one each add 60 under the lock: no update lost.
    The lock is taken here before the fork, so a child that used the inherited file would share it."""
    lock = SharedLock()
    with lock:
        pass
    value = FORK.Value("i", 0, lock=False)
    procs = [FORK.Process(target=_add_under_lock, args=(lock, value, 60)) for _ in range(2)]
    threads = [threading.Thread(target=_add_under_lock, args=(lock, value, 60)) for _ in range(2)]
    for w in [*procs, *threads]:
        w.start()
    for w in [*procs, *threads]:
        w.join(timeout=60)  # a limit against a hang, not a speed check
    assert not any(w.is_alive() for w in [*procs, *threads]), "a holder never let go"
    assert value.value == 240


def _die_holding(lock: SharedLock) -> None:
    lock.acquire()
    os.kill(os.getpid(), 9)


def test_a_process_killed_inside_it_frees_it():
    lock = SharedLock()
    child = FORK.Process(target=_die_holding, args=(lock,))
    child.start()
    child.join()
    assert child.exitcode == -9
    got = threading.Event()

    def take() -> None:
        with lock:
            got.set()

    t = threading.Thread(target=take, daemon=True)
    t.start()
    t.join(timeout=30)  # a limit against a hang, not a speed check
    assert got.is_set(), "the dead holder's lock was never freed"


def test_a_pickled_copy_shares_the_lock_and_the_creator_removes_the_file():
    lock = SharedLock()
    copy = pickle.loads(pickle.dumps(lock))
    assert copy.path == lock.path
    lock.acquire()
    taken = threading.Event()

    def take(other: SharedLock) -> None:
        with other:
            taken.set()

    t = threading.Thread(target=take, args=(copy,), daemon=True)
    t.start()
    time.sleep(0.2)
    assert not taken.is_set()  # the copy waits for the original's holder (same process, other thread)
    lock.release()
    t.join(timeout=30)
    assert taken.is_set()
    path = lock.path
    del lock, copy
    import gc

    gc.collect()
    assert not os.path.exists(path)


def test_the_lock_file_is_named_after_its_process_and_a_dead_ones_is_removed(tmp_path):
    """A kill -9 leaves the file (no finalizer runs): the next run removes those of dead processes."""
    import subprocess
    import sys

    from streamrl.placement.leftovers import LOCK_PREFIX, remove_leftovers

    lock = SharedLock()
    assert os.path.basename(lock.path).startswith(f"{LOCK_PREFIX}{os.getpid()}-")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid names a process that no longer exists
    dead = tmp_path / f"{LOCK_PREFIX}{gone.pid}-x"
    live = tmp_path / f"{LOCK_PREFIX}{os.getpid()}-y"
    other = tmp_path / "streamrl-lock-notapid-z"
    for f in (dead, live, other):
        f.write_text("")
    assert remove_leftovers(shm=tmp_path / "no-shm", tmp=tmp_path) == 1
    assert not dead.exists() and live.exists() and other.exists()


def test_a_tmpdir_without_flock_puts_the_lock_in_dev_shm(monkeypatch):
    """TMPDIR on a filesystem without flock (some network filesystems): the lock goes to tmpfs."""
    import fcntl

    real = fcntl.flock

    def flock(fd, op):
        path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
        if not path.startswith("/dev/shm/"):
            raise OSError(38, "Function not implemented")
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    lock = SharedLock()
    assert lock.path.startswith("/dev/shm/")
    with lock:
        pass


def test_a_lock_no_longer_used_closes_its_file():
    import gc

    from streamrl.placement.leftovers import LOCK_PREFIX

    def open_lock_files() -> int:
        """The process's descriptors open on a lock file (others come and go with other tests)."""
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += LOCK_PREFIX in os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass  # closed while listing
        return count

    gc.collect()
    before = open_lock_files()
    for _ in range(20):
        lock = SharedLock()
        with lock:
            pass
        copy = pickle.loads(pickle.dumps(lock))
        with copy:
            pass
        del lock, copy
    gc.collect()
    assert open_lock_files() == before
