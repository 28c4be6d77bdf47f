"""The console commands pip installs (pyproject.toml [project.scripts]):
each runs the binary the package carries in shmtensor/bin."""

import os
import sys

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def binary(name):
    """Path of the package's `name` (shmtensord or shmtensorctl)."""
    return os.path.join(BIN, name)


def _run(name):
    path = binary(name)
    argv = [os.path.basename(sys.argv[0]) or name] + sys.argv[1:]
    try:
        os.execv(path, argv)
    except OSError as e:
        sys.exit(f"{name}: cannot run {path}: {e.strerror}")


def shmtensord():
    _run("shmtensord")


def shmtensorctl():
    _run("shmtensorctl")
