"""One client per process and daemon address, made on first use (and made
anew in a child after fork: a client does not cross fork)."""

import os
import threading

_lock = threading.Lock()
_clients = {}  # (pid, address) -> Client


def local_client(address=None):
    """This process's client of the daemon at `address` (None: as connect()
    resolves it, see shmtensor._autostart). Thread-safe."""
    from . import _autostart, connect
    address = _autostart.resolve(address)
    key = (os.getpid(), address)
    with _lock:
        c = _clients.get(key)
        if c is None:
            c = connect(address, client_name=f"shmtensor pid {os.getpid()}")
            _clients[key] = c
        return c
