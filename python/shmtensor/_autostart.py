"""The private daemon a job starts for itself when nobody runs one.

connect() (and so the DataLoader and the broadcast helper) with no address,
$SHMTENSOR_ADDRESS unset and no daemon answering at the default address
starts one shmtensord for this process, the package's own
(shmtensor/bin/shmtensord):

- its socket in a fresh directory of its own (0700, under
  $XDG_RUNTIME_DIR or /tmp), which this process makes before the daemon
  starts (mkdtemp), so its name is never public (the daemon's command line
  is, in /proc) before it exists; its pool is unnamed memory (a memfd), in
  no file system, so a container's small /dev/shm does not bound it;
- its pool $SHMTENSOR_POOL_SIZE (e.g. 4GiB), else the smallest of 1 GiB,
  half of the memory the kernel says is available (MemAvailable) and a
  quarter of this process's cgroup memory limit;
- its address exported as $SHMTENSOR_ADDRESS, so every child process
  started after it (DataLoader workers, torch.multiprocessing children;
  fork, spawn and forkserver alike: a forkserver started before has the
  environment of then) uses it; the DataLoader also hands it to its
  workers itself, whenever their forkserver started;
- one log line (logger "shmtensor", INFO; on stderr when logging is not
  configured) saying what was started;
- it ends when this process ends, however it ends (SIGKILL too): the daemon
  watches this process's pidfd (shmtensord --owner-pid) and then cleans up
  as on SIGTERM, segments, socket and directory; if the daemon itself dies
  first (SIGKILL, the OOM killer), a thread of this process that watches
  its pidfd removes what it left in the directory, and the directory.

$SHMTENSOR_AUTOSTART=0 turns this off (connect() then raises
DaemonUnavailableError). An explicit address never starts anything. A
daemon that serves the default address is used as it is when the address
is this user's: its directory belongs to this user (or root) and no one
else may write it, and the process listening there runs as this user (or
root, SO_PEERCRED). Otherwise (another user made /tmp/shmtensor-<uid>/
first, say) the job says once why it does not use it, and starts its own.

Thread-safe: one daemon per process, whichever thread asks first.
"""

import errno
import logging
import os
import secrets
import select
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

from . import _commands
from . import _core
from .errors import DaemonUnavailableError

__all__ = ["resolve", "private_daemon"]

ADDRESS_ENV = "SHMTENSOR_ADDRESS"
AUTOSTART_ENV = "SHMTENSOR_AUTOSTART"
POOL_SIZE_ENV = "SHMTENSOR_POOL_SIZE"
DEFAULT_POOL_BYTES = 1 << 30
MIN_POOL_BYTES = 16 << 20
READY_TIMEOUT_S = 60.0

_log = logging.getLogger("shmtensor")
_lock = threading.Lock()
_private = None  # _PrivateDaemon of this process, once started.


def _after_fork_in_child():
    # A fork while another thread was starting the daemon must not leave
    # the child a held lock (the child has $SHMTENSOR_ADDRESS, or starts
    # its own).
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _PrivateDaemon:
    __slots__ = ("owner", "address", "process", "pool")

    def __init__(self, owner, address, process, pool):
        self.owner, self.address = owner, address
        self.process, self.pool = process, pool


def _unavailable(message):
    return DaemonUnavailableError(message, "UNAVAILABLE")


def _mine():
    """This process's _PrivateDaemon (a forked child's parent's is not)."""
    p = _private
    return p if p is not None and p.owner == os.getpid() else None


def private_daemon():
    """(pid, address) of the daemon this process started, or None."""
    p = _mine()
    return None if p is None else (p.process.pid, p.address)


def why_unavailable(address):
    """A sentence on why the private daemon at `address` does not answer
    (it exited, with its status), or None when it is not ours or runs."""
    p = _mine()
    if p is None or p.address != address:
        return None
    rc = p.process.poll()
    if rc is None:
        return None
    how = f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
    return (f"the private shmtensord this process started (pid "
            f"{p.process.pid}) {how}; its log is on this process's stderr")


def resolve(address=None, start=True):
    """The address connect() uses for `address`: itself when given, else
    $SHMTENSOR_ADDRESS, else the default address if a daemon answers there
    (or autostart is off), else a private daemon's, started now (with
    start=False: None instead)."""
    if address:
        return address
    env = os.environ.get(ADDRESS_ENV)
    if env:
        return env
    default = _core.default_address()
    if os.environ.get(AUTOSTART_ENV, "1") == "0":
        return default
    with _lock:
        global _private
        if _mine() is not None:
            return _private.address  # $SHMTENSOR_ADDRESS was unset since.
        serving, why_not = _probe_default(default)
        if serving:
            return default
        if not start:
            return None
        if why_not:
            _say(f"not using the default address {default}: {why_not}; "
                 f"starting a private shmtensord instead")
        _private = _start(default)
        os.environ[ADDRESS_ENV] = _private.address
        return _private.address


def _say(message):
    """One line for the user: logger "shmtensor" at INFO, or stderr when
    logging is not configured."""
    if _log.hasHandlers():
        _log.info(message)
    else:
        print(f"shmtensor: {message}", file=sys.stderr, flush=True)


def _probe_default(address):
    """(serving, why_not) for the default address: (True, None) when this
    user's daemon answers there; (False, None) when nothing does; (False,
    a sentence) when the address is not this user's to use (another user's
    directory or socket), whether or not something answers there."""
    if not address.startswith("unix:"):
        return True, None  # Not ours to judge: connect() says.
    path = address[len("unix:"):]
    directory = os.path.dirname(path) or "."
    me = os.geteuid()
    try:
        st = os.lstat(directory)
    except OSError:
        return False, None  # No directory: no daemon.
    if not stat.S_ISDIR(st.st_mode):
        return False, f"{directory} is not a directory"
    if st.st_uid not in (me, 0):
        return False, (f"its directory {directory} belongs to uid "
                       f"{st.st_uid}, not to this user (uid {me})")
    if st.st_mode & 0o022:
        return False, (f"its directory {directory} has mode "
                       f"{stat.S_IMODE(st.st_mode):04o}: others could put "
                       f"their socket there")
    answers, owner = _listener(path)
    if not answers:
        return False, None
    if owner not in (me, 0):
        return False, (f"the process listening there runs as uid {owner}, "
                       f"not as this user (uid {me})")
    return True, None


def _listener(path):
    """(answers, uid): whether something accepts connections at the Unix
    socket `path` (a daemon's listen queue accepts at once, busy or not),
    and the uid it runs as: the kernel's word (SO_PEERCRED), or the socket
    file's owner when the queue is full; uid None when nothing answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        try:
            s.connect(path)
        except OSError as e:
            if not (e.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
                    or isinstance(e, socket.timeout)):
                return False, None  # ENOENT, ECONNREFUSED, EACCES, ...
            try:
                return True, os.lstat(path).st_uid  # Listening, queue full.
            except OSError:
                return True, None
        return True, struct.unpack(
            "3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                               struct.calcsize("3i")))[1]


def _answers(address):
    """True when something accepts connections at the Unix socket of
    `address` (for the distributed helper: the node's private daemon)."""
    if not address.startswith("unix:"):
        return True  # Not ours to judge: connect() says whether it answers.
    return _listener(address[len("unix:"):])[0]


def _socket_directory():
    """Makes the daemon's socket directory (0700, a fresh random name, made
    with O_EXCL semantics by mkdtemp) and returns its path."""
    run = os.environ.get("XDG_RUNTIME_DIR", "")
    for base in (run, tempfile.gettempdir(), "/tmp"):
        # sun_path holds 107 bytes and a NUL; "/shmtensor-job-XXXXXXXX/
        # shmtensord.sock.fd" (the longest socket) adds 42.
        if base.startswith("/") and os.path.isdir(base) and os.access(
                base, os.W_OK | os.X_OK) and len(base) + 42 <= 107:
            try:
                return tempfile.mkdtemp(prefix="shmtensor-job-", dir=base)
            except OSError:
                continue
    raise _unavailable(
        "no shmtensord answers, and there is no directory to start a "
        f"private one in ($XDG_RUNTIME_DIR, {tempfile.gettempdir()} and /tmp "
        f"are not writable, or too long for a socket path); set "
        f"{ADDRESS_ENV} to a running daemon")


def _remove_directory(directory):
    """Removes the private daemon's directory and what the daemon left in
    it (its socket, descriptor socket and lock file); it is this process's
    own (0700), so nothing else is there."""
    shutil.rmtree(directory, ignore_errors=True)


def _watch(process, pidfd, directory):
    """Thread: waits for the private daemon to end; if it died without
    cleaning up (SIGKILL, the OOM killer), removes what it left."""
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():
            pass
    finally:
        os.close(pidfd)
    process.poll()  # Reaps it, so why_unavailable can say how it ended.
    _remove_directory(directory)


def _cgroup_memory_limit():
    """This process's cgroup v2 memory.max in bytes, or None (no limit, or
    not visible)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    path = "/sys/fs/cgroup" + line[3:].strip()
                    with open(os.path.join(path, "memory.max")) as m:
                        value = m.read().strip()
                    return None if value == "max" else int(value)
    except (OSError, ValueError):
        return None
    return None


def _mem_available():
    """MemAvailable from /proc/meminfo in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _default_pool_bytes():
    """1 GiB, or less where that does not fit: half of the memory available
    (MemAvailable), a quarter of the cgroup's memory limit (a systemd unit's
    MemoryMax, a container's limit). The pool is a memfd, so /dev/shm's size
    (a container's is often 64 MiB) does not matter."""
    size = DEFAULT_POOL_BYTES
    why = "the default"
    available = _mem_available()
    if available is not None and available // 2 < size:
        size, why = available // 2, "half of the available memory"
    limit = _cgroup_memory_limit()
    if limit is not None and limit // 4 < size:
        size, why = limit // 4, "a quarter of the cgroup memory limit"
    size -= size % (1 << 20)
    if size < MIN_POOL_BYTES:
        raise _unavailable(
            f"no shmtensord answers and there is no room for a private one: "
            f"{why} is {size >> 20} MiB, under {MIN_POOL_BYTES >> 20} MiB; "
            f"set {POOL_SIZE_ENV}, free memory, or set {ADDRESS_ENV} to a "
            f"running daemon")
    return f"{size >> 20}MiB"


def _start(default):
    binary = _commands.binary("shmtensord")
    if not os.access(binary, os.X_OK):
        raise _unavailable(
            f"no shmtensord answers at {default}, and this package has none "
            f"to start ({binary} is missing): start one, or set {ADDRESS_ENV}")
    pool = os.environ.get(POOL_SIZE_ENV) or _default_pool_bytes()
    directory = _socket_directory()
    address = f"unix:{directory}/shmtensord.sock"
    ready_r, ready_w = os.pipe()
    args = [binary, "--listen", address, "--pool-size", pool,
            "--log-level", "warn", "--owner-pid", str(os.getpid()),
            "--ready-fd", str(ready_w)]
    env = dict(os.environ)
    env.pop(ADDRESS_ENV, None)
    try:
        # Its own session: a Ctrl-C meant for the job does not stop it
        # before the job's own cleanup has talked to it; it follows the
        # job's end instead. Its log (warnings and errors) goes to our
        # stderr (descriptor 2, whatever sys.stderr is now).
        # In "/": it pins no directory of the job's.
        process = subprocess.Popen(
            args, pass_fds=(ready_w,), stdin=subprocess.DEVNULL, stdout=2,
            env=env, start_new_session=True, cwd="/")
    except OSError as e:
        os.close(ready_r)
        os.close(ready_w)
        _remove_directory(directory)
        raise _unavailable(
            f"no shmtensord answers at {default}, and starting a private one "
            f"({binary}) failed: {e}") from e
    os.close(ready_w)
    try:
        said = _wait_ready(ready_r)
    except BaseException:  # A Ctrl-C while waiting, say: nothing left over.
        process.kill()
        process.wait()
        _remove_directory(directory)
        raise
    finally:
        os.close(ready_r)
    if said != b"ready\n":
        if process.poll() is None:
            process.kill()
        rc = process.wait()
        _remove_directory(directory)
        raise _unavailable(
            f"no shmtensord answers at {default}, and the private one "
            f"started for this job ({binary} --pool-size {pool}) "
            + (f"exited with status {rc} before serving (its message is "
               f"above)" if said is not None else
               f"did not serve within {READY_TIMEOUT_S:.0f} s")
            + f"; set {ADDRESS_ENV} to a running daemon, or "
            f"{AUTOSTART_ENV}=0 to not start one")
    message = (f"started a private shmtensord for this job (pid "
               f"{process.pid}, {pool} pool, {address}); it ends with this "
               f"process (pid {os.getpid()}). Set {ADDRESS_ENV} to use a "
               f"shared daemon instead")
    _say(message)
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        pidfd = None  # Python < 3.9 or Linux < 5.3: the daemon cleans up.
    if pidfd is not None:
        threading.Thread(target=_watch, args=(process, pidfd, directory),
                         name="shmtensord-watch", daemon=True).start()
    return _PrivateDaemon(os.getpid(), address, process, pool)


def _wait_ready(fd):
    """What the daemon wrote on its ready descriptor before closing it
    (b"ready\\n" once serving; less if it exited first), or None on
    timeout."""
    said = b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    poller = select.poll()  # Any descriptor number (select() stops at 1024).
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if not poller.poll(left * 1000):
            return None
        chunk = os.read(fd, 64)
        if not chunk:
            return said
        said += chunk
        if said.endswith(b"\n"):
            return said
