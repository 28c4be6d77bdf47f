"""One client per process and daemon address, made on first use (and made
anew in a child after fork: a client does not cross fork)."""

import os
import threading

_lock = threading.Lock()
_clients = {}  # (pid, address) -> Client


def local_client(address=None):
    """This process's client of the daemon at `address` (None: as connect()
    resolves it, see shmtensor._autostart). Thread-safe. After the first
    call for an address, a dict lookup: it does not resolve again (no probe
    of the default socket per call)."""
    pid = os.getpid()
    key = (pid, address or "")
    c = _clients.get(key)
    if c is not None:
        return c
    from . import _autostart, connect
    with _lock:
        c = _clients.get(key)
        if c is None:
            resolved = _autostart.resolve(address)
            # One client per daemon, whichever way it was named.
            c = _clients.get((pid, resolved))
            if c is None:
                c = connect(resolved, client_name=f"shmtensor pid {pid}")
                _clients[(pid, resolved)] = c
            _clients[key] = c
        return c
