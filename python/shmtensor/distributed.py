"""Rank-0 broadcast with one copy per node (P11).

    import shmtensor.distributed as sd
    weights = sd.broadcast(weights if rank == 0 else None, src=0)

Called on every rank of a torch.distributed group, like
torch.distributed.broadcast. Every rank gets a read-only, zero-copy view of
the same data: a NumPy array for a NumPy source, a torch tensor
(shmtensor's ReadOnlyTensor) for a torch source, dtype and shape intact.

How: ranks that share a shmtensord (same host, same daemon instance) form a
node. The source publishes the data once into its node's daemon. Each other
node has a leader (its lowest rank) that receives the bytes from the source
over torch.distributed (a broadcast in a process group of the source and
the leaders: Gloo on CPU) straight into a buffer of its own daemon's pool,
and seals it. Every rank then maps its node's copy read-only. No rank holds a
private copy; on each node the data exists once, and between ranks of one
node it crosses no socket.

Where the data lands: when the source is a CUDA tensor and every rank's
daemon has a CUDA pool on that rank's current device (torch.cuda), the copy
of each node lives in GPU memory: the source puts it device to device into
its own pool, the other leaders receive it over an NCCL group of the source
and the leaders straight into their pools, and every rank gets a read-only
CUDA tensor over its node's copy (on the device of the leader's pool; other
GPUs of the node read it through CUDA IPC). Otherwise the data lands in
host memory: a CUDA source tensor is copied to the host once, on the
source, every rank gets a CPU tensor, and the bytes between nodes go over a
Gloo group of the source and the leaders, whatever the job's own backend.

Daemons: each rank uses the daemon `address` names, else
$SHMTENSOR_ADDRESS, else the default one; where none answers, the ranks of
a host share a private daemon their lowest rank starts (shmtensor._autostart)
and which ends with that rank's process, so the ranks of a torchrun job
need no daemon started for them.

Lifetime: the object lives while any rank holds its view (array, tensor, or
anything viewing them), then returns to its pool. Every call makes a new
object: a later broadcast under the same name gets a new version, and views
of the old version stay valid and unchanged. `name` identifies the call:
ranks that pass different names or sources fail at once with ValueError
naming the ranks and values. A rank that dies makes the others fail with
RuntimeError (from the process group, within its timeout), not hang. Each
node's copy is held by its leader until every rank holds its view: on Gloo
by a barrier no rank waits for (the leader lets go when it completes, and
waits for it at exit), so a call returns as soon as this rank's view is
mapped.
"""

import atexit
import collections
import contextlib
import os
import pickle
import socket

import numpy as np
import torch
import torch.distributed as dist

from . import _autostart
from ._local import local_client
from .errors import DaemonUnavailableError

__all__ = ["broadcast", "plan", "Plan"]

Plan = collections.namedtuple("Plan", "nodes leaders node leader")
Plan.__doc__ = """Who shares a daemon and who leads: `nodes` lists each
node's global ranks (sorted), `leaders` one rank per node (the source on
its node, else the node's lowest rank), `node` and `leader` this rank's."""

# Process groups of source + leaders, made once per distinct set (new_group is
# collective: every rank makes the same calls in the same order).
_leader_groups = {}


def _describe(obj):
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return {"kind": "torch", "dtype": str(t.dtype).replace("torch.", ""),
                "shape": tuple(t.shape), "nbytes": t.numel() * t.element_size(),
                "device": t.device.type}
    a = np.asarray(obj)
    return {"kind": "numpy", "dtype": a.dtype.str, "shape": a.shape,
            "nbytes": a.nbytes}


# What each rank's part of a Gloo exchange may take in one fixed-size
# all_gather (a length word, then the pickle).
_SLOT = 2048
_OVERFLOW = 0xFFFFFFFF


def _gather(info, group, step, name):
    """Every rank's `info` (a small picklable dict), in rank order of the
    group."""
    return _gather_start(info, group, step, name)()


def _gather_start(info, group, step, name):
    """Starts _gather(info, ...) and returns the function that finishes it
    and returns its result: on Gloo the exchange runs meanwhile (Gloo's own
    thread), so the caller can work while it is on its way. On Gloo one
    all_gather of a fixed-size tensor (torch's all_gather_object makes two
    collectives and more copies: 7-8 ms here against 3-4 ms,
    docs/performance.md, "Broadcast"); when any rank's info does not fit
    (every rank learns it from the same exchange), or on another backend,
    all_gather_object."""
    n = dist.get_world_size(group)

    def failed(e):
        return RuntimeError(
            f"shmtensor.distributed.broadcast(name={name!r}) failed while "
            f"{step}: a rank is gone or unreachable ({e})")

    def by_object():
        out = [None] * n
        try:
            dist.all_gather_object(out, info, group=group)
        except RuntimeError as e:
            raise failed(e) from e
        return out

    if dist.get_backend(group) != "gloo":
        return by_object
    blob = pickle.dumps(info)
    mine = torch.zeros(_SLOT, dtype=torch.uint8)
    fits = len(blob) <= _SLOT - 4
    header = len(blob) if fits else _OVERFLOW
    mine[:4] = torch.tensor(list(header.to_bytes(4, "little")),
                            dtype=torch.uint8)
    if fits:
        mine[4:4 + len(blob)] = torch.frombuffer(bytearray(blob),
                                                 dtype=torch.uint8)
    slots = [torch.empty(_SLOT, dtype=torch.uint8) for _ in range(n)]
    try:
        work = dist.all_gather(slots, mine, group=group, async_op=True)
    except RuntimeError as e:
        raise failed(e) from e

    def finish():
        try:
            work.wait()
        except RuntimeError as e:
            raise failed(e) from e
        raw = [bytes(t.numpy()) for t in slots]
        sizes = [int.from_bytes(r[:4], "little") for r in raw]
        if _OVERFLOW in sizes:
            return by_object()
        return [pickle.loads(r[4:4 + k]) for r, k in zip(raw, sizes)]

    return finish


def _source_of(infos, src):
    """The source's info, once every rank's call agrees; ValueError naming
    the ranks and values otherwise."""
    calls = {(i["name"], i["src"]) for i in infos}
    if len(calls) > 1:
        detail = "; ".join(f"rank {i['rank']}: name={i['name']!r} "
                           f"src={i['src']}" for i in infos)
        raise ValueError(f"mismatched shmtensor.distributed.broadcast "
                         f"calls: {detail}")
    source = next((i for i in infos if i["rank"] == src), None)
    if source is None:
        raise ValueError(f"src {src} is not a rank of the group "
                         f"(ranks {sorted(i['rank'] for i in infos)})")
    return source


def _plan_from(infos, src):
    nodes = collections.defaultdict(list)
    for info in infos:
        nodes[(info["host"], info["epoch"])].append(info["rank"])
    node_list = sorted(sorted(r) for r in nodes.values())
    leaders = [src if src in n else n[0] for n in node_list]
    return node_list, leaders


def _node_address(address, group, name):
    """The daemon this rank uses (a collective): `address`, else as
    shmtensor.connect() resolves it, except that the ranks of one host that
    find no daemon share the private one their lowest rank starts (one copy
    per node, not one per rank; it lives as long as that rank's process).
    The others take its address as $SHMTENSOR_ADDRESS, for their own
    children too."""
    host = _sharing_key()
    found = _autostart.resolve(address, start=False)
    infos = _gather({"rank": dist.get_rank(), "host": host,
                     "found": found is not None}, group, "finding the daemons",
                    name)
    if all(i["found"] for i in infos):
        return found
    # Decided from what every rank reported: alike on all.
    starters = {}
    for i in sorted(infos, key=lambda i: i["rank"]):
        if not i["found"]:
            starters.setdefault(i["host"], i["rank"])
    started = None
    if starters.get(host) == dist.get_rank():
        try:
            started = {"address": _autostart.resolve(address)}
        except Exception as e:  # noqa: BLE001 - every rank raises it below.
            started = {"error": f"{type(e).__name__}: {e}"}
    outs = _gather({"rank": dist.get_rank(), "started": started}, group,
                   "starting a daemon for the node", name)
    by_rank = {o["rank"]: o["started"] for o in outs}
    failed = [(r, s["error"]) for r, s in sorted(by_rank.items())
              if s is not None and "error" in s]
    if failed:
        raise DaemonUnavailableError(
            "shmtensor.distributed: no daemon answers, and starting one for "
            "the node failed: " + "; ".join(f"rank {r}: {e}" for r, e in failed),
            "UNAVAILABLE")
    taken, took = None, found is None
    if took:
        found = by_rank[starters[host]]["address"]
        if not _autostart._answers(found):
            taken = f"{found} does not answer here"
    # Every rank learns whether every taker reached its host's daemon, and
    # all raise together if one did not (none waits for the others then).
    outs = _gather({"rank": dist.get_rank(), "error": taken}, group,
                   "reaching the node's daemon", name)
    failed = [(o["rank"], o["error"]) for o in outs if o["error"]]
    if failed:
        raise DaemonUnavailableError(
            "shmtensor.distributed: ranks cannot reach the daemon their "
            "host's lowest rank started: " +
            "; ".join(f"rank {r}: {e}" for r, e in sorted(failed)),
            "UNAVAILABLE")
    if took:
        os.environ[_autostart.ADDRESS_ENV] = found
    return found


def _sharing_key():
    """What ranks that can share a private daemon have in common: the
    machine (host name and boot), the mount namespace (the same socket
    path) and the user (the daemon's directory is 0700)."""
    parts = [socket.gethostname(), str(os.getuid())]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(str(os.stat("/proc/self/ns/mnt").st_ino))
    except OSError:
        pass
    return "/".join(parts)


def plan(src=0, group=None, address=None):
    """The node layout broadcast uses, computed from the group (a
    collective: call it on every rank). Nodes are ranks on one host using one
    daemon instance (its epoch), so two daemons on one host are two nodes."""
    c = local_client(_node_address(address, group, None))
    infos = _gather({"rank": dist.get_rank(), "host": socket.gethostname(),
                     "epoch": c.daemon_epoch}, group, "planning", None)
    nodes, leaders = _plan_from(infos, src)
    me = dist.get_rank()
    k = next(i for i, n in enumerate(nodes) if me in n)
    return Plan(nodes, leaders, nodes[k], leaders[k])


def _gpu_of_rank(c):
    """This rank's current CUDA device if its daemon has a pool there."""
    if not torch.cuda.is_available():
        return None
    device = f"cuda:{torch.cuda.current_device()}"
    return device if c.has_pool_on(device) else None


def _bytes_of_source(obj, on_gpu):
    """The source's bytes as a flat uint8 tensor: on its GPU for the GPU
    path, else on the CPU (no copy if already contiguous there)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        t = (t if on_gpu else t.cpu()).contiguous().reshape(-1)
        return t.view(torch.uint8) if t.numel() else t.to(torch.uint8)
    a = np.ascontiguousarray(obj)
    return torch.from_numpy(a.reshape(-1).view(np.uint8))


def _receive_buffer(c, meta, device):
    """A pool buffer of the source's layout on `device`, and a flat uint8
    tensor over it to receive into."""
    if meta["kind"] == "torch":
        buf = c.create(meta["shape"], getattr(torch, meta["dtype"]),
                       device=device)
        flat = buf.tensor().reshape(-1)
        return buf, flat.view(torch.uint8) if flat.numel() else flat
    buf = c.create(meta["shape"], np.dtype(meta["dtype"]))
    return buf, torch.from_numpy(np.asarray(buf).reshape(-1).view(np.uint8))


def broadcast(tensor_or_array, src=0, group=None, name=None, address=None):
    """Broadcasts from global rank `src` to every rank of `group` (None: the
    default group) with one copy per node; returns a read-only zero-copy
    view on every rank (the source's too). Non-source ranks may pass None.
    `address`: this rank's daemon (None: $SHMTENSOR_ADDRESS, the default,
    else one the host's ranks share, which their lowest rank starts). See
    the module docstring for nodes, lifetime and errors."""
    me = dist.get_rank()
    meta = _describe(tensor_or_array) if me == src else None
    # One exchange agrees on the call when every rank finds its daemon (the
    # usual case). A host source makes its object's buffer first and sends
    # its ref with it, which is all the ranks of its node need, and copies
    # into it while the exchange is on its way; the other ranks' gets wait
    # for its seal.
    found = _autostart.resolve(address, start=False)
    c = local_client(found) if found is not None else None
    early = None  # (buffer, flat uint8 tensor over it) of a host source.
    if c is not None and me == src and meta.get("device") != "cuda":
        early = _receive_buffer(c, meta, "cpu")

    def agree_start():
        return _gather_start(
            {"rank": me, "host": socket.gethostname(),
             "found": c is not None,
             "epoch": c.daemon_epoch if c is not None else None,
             "name": name, "src": src, "meta": meta,
             "gpu": _gpu_of_rank(c) if c is not None else None,
             "ref": early[0].ref_bytes if early else None},
            group, "agreeing on the call", name)

    agreed = agree_start()
    ref = None
    if early is not None:
        # 1. The source publishes once into its node's daemon (here a host
        #    source; a CUDA one below, once the path is agreed).
        # Nothing of the buffer but `buf` may be alive at its seal: a
        # tensor over it would make the seal close its range at once (a
        # page-table change of every page, and again at the next call).
        buf, data = early
        early = None
        if meta["nbytes"]:
            # NumPy's copy (memcpy), which torch's copy_ of a uint8 tensor
            # trails here.
            np.copyto(data.numpy(),
                      _bytes_of_source(tensor_or_array, False).numpy())
        del data
        ref = buf.seal()
        del buf
    try:
        infos = agreed()
        if not all(i["found"] for i in infos):
            # A rank has no daemon: the host's lowest rank starts one for
            # its node (collectives every rank takes), then the call is
            # agreed anew.
            if ref is not None:
                ref.release()
                ref = None
            early = None  # The next agreement sends no ref.
            c = local_client(_node_address(address, group, name))
            infos = agree_start()()
        source = _source_of(infos, src)
    except BaseException:
        # The source's object goes before the error reaches the caller
        # (release() waits for the daemon; dropping the ref would not).
        if ref is not None:
            with contextlib.suppress(Exception):
                ref.release()
        raise
    meta = source["meta"]
    nodes, leaders = _plan_from(infos, src)
    my_leader = next(l for n, l in zip(nodes, leaders) if me in n)
    # The GPU path, decided from what every rank reported (so alike on all).
    on_gpu = (meta["kind"] == "torch" and meta.get("device") == "cuda"
              and all(i["gpu"] for i in infos)
              and (len(leaders) == 1 or dist.is_nccl_available()))
    my_gpu = next(i["gpu"] for i in infos if i["rank"] == me)
    target = my_gpu if on_gpu else "cpu"

    if me == src and ref is None:
        # Host memory unless the GPU path was chosen (module docstring),
        # even where the daemon has a CUDA pool on the tensor's device.
        ref = c.put(tensor_or_array, device=target)
    # 2. Each other node's leader receives the bytes over the process group
    #    straight into its own pool, then seals.
    if len(leaders) > 1:
        ranks = tuple(sorted(leaders))
        # Whatever the job's backend: Gloo between host pools, NCCL between
        # GPU pools.
        backend = "nccl" if on_gpu else "gloo"
        key = (ranks, backend)
        if key not in _leader_groups:
            _leader_groups[key] = dist.new_group(ranks=list(ranks),
                                                 backend=backend)
        if me in ranks:
            if me == src:
                data = _bytes_of_source(tensor_or_array, on_gpu)
            else:
                buf, data = _receive_buffer(c, meta, target)
            if meta["nbytes"]:
                try:
                    dist.broadcast(data, src, group=_leader_groups[key])
                except RuntimeError as e:
                    raise RuntimeError(
                        f"shmtensor.distributed.broadcast(name={name!r}) "
                        f"failed sending the data between nodes: {e}") from e
            del data
            if me != src:
                ref = buf.seal()  # On the GPU: after the NCCL receive.
                del buf
    # 3. Every rank maps its node's copy: the source's ref came with the
    #    agreement when its node is the only one.
    if len(leaders) == 1 and source["ref"] is not None:
        mine = source["ref"]
    else:
        refs = _gather({"rank": me,
                        "ref": bytes(ref) if ref is not None else None},
                       group, "exchanging refs", name)
        mine = next(i["ref"] for i in refs if i["rank"] == my_leader)
    from . import ObjectRef
    view = c.get(ObjectRef(mine))
    # Every page mapped in one system call, not a fault per page as the
    # caller reads (docs/performance.md, "Broadcast"); nothing on a later
    # call that gets the same range.
    view.populate()
    out = np.asarray(view) if meta["kind"] == "numpy" else view.tensor()
    view.close()  # `out` holds the lease.
    # 4. Leaders keep their ref until every rank holds a view.
    _release_after_every_rank(ref, group, name)
    return out


# Barriers in flight whose completion drops a leader's ref; waited for at
# exit (_wait_for_pending_barriers). This process's own: a forked child
# starts with none (the parent's complete on the parent's Gloo threads,
# which the child has not, so waiting for them would never end).
_pending_barriers = set()
os.register_at_fork(after_in_child=_pending_barriers.clear)


def _release_after_every_rank(ref, group, name):
    """Drops `ref` (a leader's, or None) once every rank of `group` has
    entered this barrier, which each does after it holds its view, so no
    rank's get can find the object gone. On Gloo the barrier runs in the
    background and no rank waits for it: the ref is dropped on Gloo's thread
    when the barrier completes (or fails: a rank is gone, and its get with
    it). A process that exits first waits for it at exit, so a slow rank
    still finds the object. On another backend (NCCL: its futures complete
    with the device's stream, not with every rank's arrival) a plain
    barrier."""
    if dist.get_backend(group) != "gloo":
        try:
            dist.barrier(group)
        except RuntimeError as e:
            raise RuntimeError(
                f"shmtensor.distributed.broadcast(name={name!r}) failed "
                f"waiting for every rank to map the data: {e}") from e
        if ref is not None:
            ref.release()
        return
    try:
        work = dist.barrier(group, async_op=True)
    except RuntimeError as e:
        raise RuntimeError(
            f"shmtensor.distributed.broadcast(name={name!r}) failed "
            f"waiting for every rank to map the data: {e}") from e
    if ref is None:
        return  # The barrier goes on in Gloo; nothing waits for it here.
    held = [ref]  # Dropped, not release()d: no call into the daemon there.
    _pending_barriers.add(work)

    def done(_):
        held.clear()
        _pending_barriers.discard(work)

    work.get_future().then(done)


@atexit.register
def _wait_for_pending_barriers():
    for work in list(_pending_barriers):
        with contextlib.suppress(Exception):
            work.wait()
