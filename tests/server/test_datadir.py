"""Issue 33: one server per data directory, and a data directory that cannot
be written, on real ``cayuga serve`` processes.

Two servers on one data directory both started, both appended to the journal
and both numbered witnesses: acknowledged events were lost. Now the first
holds an exclusive lock (``cayuga.lock``, flock) for its life; a second exits
2 with one line naming the directory and the first one's pid and ports; the
kernel drops the lock with the process, so a restart after kill -9 starts. A
forked child (the snapshot writer) does not keep it, and a server in a test's
process releases it when it stops (restart-on-the-same-directory tests).
A read-only data directory gave a 60-line traceback; now one line, exit 2.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from clients.testing import ServerProcess, cayuga_command, cayuga_env, running_server, stop_process, wait_until
from server.durability.datadir import LOCK_NAME, DataDirInUse
from server.serve import RunningServer
from tests.server.conftest import make_settings
from tests.server.tmpfs import tmpfs


def serve(data_dir, tmp_path, name: str) -> tuple[subprocess.Popen, object]:
    """``cayuga serve`` on ports it picks, its port file and stderr under ``tmp_path``."""
    port_file = tmp_path / f"{name}.ports"
    err = open(tmp_path / f"{name}.err", "w+")
    proc = subprocess.Popen(cayuga_command("serve", "--http-port", "0", "--tcp-port", "0", "--data-dir",
                                           str(data_dir), "--port-file", str(port_file)),
                            env=cayuga_env(), stdout=subprocess.DEVNULL, stderr=err)
    return proc, err


def outcome(proc: subprocess.Popen, port_file) -> int | None:
    """Wait until ``proc`` exits (its code) or comes up (None: it bound its ports)."""
    wait_until(lambda: proc.poll() is not None or port_file.exists(), 60, what="the server to exit or come up")
    return proc.poll() if not port_file.exists() else None


def refused_to_start(data_dir, tmp_path, name: str) -> str:
    """Start a second ``cayuga serve`` on ``data_dir``: it must exit 2; its stderr."""
    proc, err = serve(data_dir, tmp_path, name)
    try:
        code = outcome(proc, tmp_path / f"{name}.ports")
        assert code == 2, f"a second server on {data_dir} started (exit code {code})"
        err.seek(0)
        return err.read()
    finally:
        stop_process(proc)
        err.close()


def test_a_second_server_on_the_same_data_directory_exits_2_naming_the_first(tmp_path):
    data = tmp_path / "data"
    first = ServerProcess(data, tmp_path / "first.log")
    second = None
    try:
        first.start()
        first.wait_up()
        said = refused_to_start(data, tmp_path, "second")
        lines = said.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in said, said
        line = lines[0]
        assert line.startswith("cayuga: cannot start: ")
        assert f"the data directory {data} is in use by another cayuga serve" in line
        assert f"pid {first.proc.pid}" in line
        assert f"HTTP port {first.http_port}" in line and f"TCP port {first.tcp_port}" in line
        assert "--data-dir or CAYUGA_DATA_DIR" in line
        assert first.health()["status"] == "ok"  # the first one goes on

        # kill -9: the kernel releases the lock with the process; a restart starts
        first.kill()
        assert (data / LOCK_NAME).exists()  # the file stays; the lock does not
        second = ServerProcess(data, tmp_path / "restart.log")
        second.start()
        second.wait_up()
        holder = json.loads((data / LOCK_NAME).read_text())
        assert (holder["pid"], holder["http_port"], holder["tcp_port"]) == (
            second.proc.pid, second.http_port, second.tcp_port)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert "Traceback" not in first.log.read_text() + second.log.read_text()


def test_a_server_in_this_process_holds_the_lock_until_it_stops_and_a_restart_gets_it(tmp_path):
    data = tmp_path / "data"
    with running_server(data) as srv:
        with pytest.raises(DataDirInUse, match=f"pid {os.getpid()}, HTTP port {srv.http_port}, "
                                               f"TCP port {srv.tcp_port}"):
            RunningServer(make_settings(tmp_path, data_dir=data))
        said = refused_to_start(data, tmp_path, "process")  # a process is refused by it too
        assert f"pid {os.getpid()}" in said
    assert (data / LOCK_NAME).read_text() == ""  # released and emptied at stop
    with running_server(data) as srv:  # the same directory, again (what restart tests do)
        assert json.loads((data / LOCK_NAME).read_text())["pid"] == os.getpid()


CHILD_KEEPS = textwrap.dedent("""
    import os, sys, time
    from server.durability.datadir import DataDirLock
    lock = DataDirLock(sys.argv[1])
    lock.acquire()
    child = os.fork()  # as the snapshot writer is forked (server/durability/snapshot.py)
    if child == 0:
        time.sleep(600)  # outlives its parent
        os._exit(0)
    print(child, flush=True)
    time.sleep(600)
""")


@contextlib.contextmanager
def reaping_orphans():
    """This process adopts its descendants' orphans (PR_SET_CHILD_SUBREAPER), so a
    test can reap a grandchild whose parent it killed: no process is left behind."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


PR_SET_CHILD_SUBREAPER = 36


def test_a_forked_child_does_not_keep_the_lock_after_its_parent_dies(tmp_path):
    """A flock belongs to the open file a forked child shares: a child still
    running after its parent's kill -9 would keep every restart out."""
    with reaping_orphans():
        _a_forked_child_outlives_its_parent(tmp_path)


def _a_forked_child_outlives_its_parent(tmp_path) -> None:
    data = tmp_path / "data"
    parent = subprocess.Popen([sys.executable, "-c", CHILD_KEEPS, str(data)], env=cayuga_env(),
                              stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert "in use" in refused_to_start(data, tmp_path, "while-parent-lives")
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        os.kill(child, 0)  # the child still runs
        proc, err = serve(data, tmp_path, "after-kill")
        try:
            code = outcome(proc, tmp_path / "after-kill.ports")
            err.seek(0)
            assert code is None, f"cayuga serve exited {code}: {err.read()}"
            os.kill(child, 0)  # the child still ran while the new server took the lock
        finally:
            assert stop_process(proc) == 0
            err.close()
    finally:
        stop_process(parent)
        parent.stdout.close()
        if child is not None:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)  # adopted by this process (reaping_orphans)


def test_a_read_only_data_directory_is_one_line_and_exit_2(tmp_path):
    with tmpfs(tmp_path, "1m") as mnt:
        (mnt / "data").mkdir()
        done = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        for data in (mnt / "data", mnt / "data" / "new"):  # an existing directory, one to create
            proc = subprocess.run(cayuga_command("serve", "--http-port", "0", "--tcp-port", "0", "--data-dir",
                                                 str(data)), env=cayuga_env(), capture_output=True, text=True,
                                  timeout=60)
            assert proc.returncode == 2, proc.stderr
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1, proc.stderr
            assert lines[0].startswith(f"cayuga: cannot start: the data directory {data} cannot be used "
                                       "(Read-only file system)"), lines[0]
            assert "--data-dir or CAYUGA_DATA_DIR" in lines[0]
