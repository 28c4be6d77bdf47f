"""What a worker says when its batch finds no room in the pool: how large
the pool should be, or that the training loop keeps too many batches."""

__all__ = ["pool_advice", "pool_size_arg"]


def pool_advice(error, nbytes, workers, in_flight, ring_bytes, pool_size):
    """The message for a batch of `nbytes` that got `error` (the daemon's
    text), with `workers` workers, about `in_flight` batches in flight,
    each worker holding a ring of `ring_bytes` (0: none) and a pool of
    `pool_size` bytes (0: unknown)."""
    need = nbytes * (in_flight + 2)
    rings = ""
    if ring_bytes:  # Every worker holds one like it for its life.
        need += workers * ring_bytes
        rings = f" and {workers} batch rings of {ring_bytes} bytes"
    what = (f"{error}. A batch needs {nbytes} bytes; with about "
            f"{in_flight} batches in flight ({workers} workers x "
            f"prefetch_factor), 2 held by the training loop{rings}, the "
            f"pool should hold at least {need} bytes")
    if pool_size >= need:
        return (f"{what}, and it holds {pool_size}: the training loop keeps "
                f"more batches than that alive (a list of batches, or "
                f"tensors from them); each keeps its memory until it is "
                f"dropped")
    return (f"{what}: start shmtensord with --pool-size "
            f"{pool_size_arg(need)} (or lower batch_size, num_workers "
            f"or prefetch_factor)")


def pool_size_arg(nbytes):
    """A --pool-size value of at least `nbytes`, in whole MiB or GiB."""
    mib = -(-nbytes // (1 << 20))
    return f"{-(-mib // 1024)}GiB" if mib >= 1024 else f"{mib}MiB"
