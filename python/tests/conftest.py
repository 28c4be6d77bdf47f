"""Fixtures: a real shmtensord per test (testing/python/shmtensor_testing.py)."""

import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Two ways to run: against the package pip installed in the interpreter
# running the tests ($SHMTENSOR_TEST_INSTALLED=1, what ctest does: see
# python/CMakeLists.txt), or against the build tree's package
# ($SHMTENSOR_PYTHONPATH, default build/python).
INSTALLED = os.environ.get("SHMTENSOR_TEST_INSTALLED") == "1"
if INSTALLED:
    PYTHONPATH = None
else:
    PYTHONPATH = os.environ.get("SHMTENSOR_PYTHONPATH",
                                os.path.join(REPO, "build", "python"))
    if PYTHONPATH not in sys.path:
        sys.path.insert(0, PYTHONPATH)

import shmtensor  # noqa: E402 - after the path is set.

if INSTALLED and not os.path.abspath(shmtensor.__file__).startswith(
        os.path.join(sys.prefix, "")):
    raise RuntimeError(f"shmtensor imported from {shmtensor.__file__}, not "
                       f"from the environment {sys.prefix}")

# The one Python daemon launcher (testing/python), shared with bench/python.
sys.path.insert(0, os.path.join(REPO, "testing", "python"))
from shmtensor_testing import (Daemon, HugeTmpfs, daemon_path,  # noqa: E402,F401
                               pool_memfds, shmtensor_shm_files)

DAEMON = daemon_path()


def proto_enum(enum, prefix):
    """{value: name without `prefix`} of enum `enum` of the repository's
    shmtensor.proto: what the wire says, for tests that check a table
    against it."""
    import re
    with open(os.path.join(REPO, "proto", "shmtensor", "v1",
                           "shmtensor.proto")) as f:
        text = f.read()
    body = re.search(r"enum %s \{(.*?)\}" % enum, text, re.S).group(1)
    return {int(code): name for name, code in
            re.findall(r"^\s*%s(\w+)\s*=\s*(\d+);" % prefix, body, re.M)}


def child_env(**extra):
    """The environment of a child interpreter that imports the same
    package as this one."""
    env = dict(os.environ, **extra)
    if PYTHONPATH is not None:
        env["PYTHONPATH"] = PYTHONPATH
    return env


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    d.kill()


@pytest.fixture
def huge_daemon(tmp_path):
    """A daemon whose 256 MiB pool is on a tmpfs mounted huge=always (2 MiB
    pages). Mounting needs root; the test is skipped, saying so, without."""
    with HugeTmpfs("300m", parent=str(tmp_path)) as huge:
        if huge.path is None:
            pytest.skip(huge.why)
        with Daemon(pool_dir=huge.path) as d:
            yield d


@pytest.fixture
def client(daemon):
    import shmtensor
    return shmtensor.connect(daemon.address)


def used(client):
    """Bytes of the first pool held by objects: the clients' stock (buffers
    granted ahead of their puts, stats' stock_bytes) left out."""
    pool = client.stats()["pools"][0]
    return pool["used_bytes"] - pool["stock_bytes"]


def wait_until(predicate, timeout=1.0):
    """Polls `predicate` until true or `timeout` seconds; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.005)


def run_python(code, address, *args, timeout=60):
    """Runs `code` in a fresh interpreter (Debian's, with the package on its
    path) and returns the CompletedProcess."""
    env = child_env(SHMTENSOR_ADDRESS=address)
    return subprocess.run([sys.executable, "-c", code, *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def spawn_python(code, address, *args):
    env = child_env(SHMTENSOR_ADDRESS=address)
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
