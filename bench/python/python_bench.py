#!/usr/bin/python3
"""Python binding overhead: the 64 KiB lifecycle (create, seal, get, release)
through the Python package and through the C++ client, side by side in one
run against one daemon and one session. The two alternate lifecycle by
lifecycle, and the overhead is the median of the paired differences, so that
the machine's drift (large on a shared machine) cancels out. Measured per
step (create, fill, seal, get, read, release view, release ref) in the CPU
time of the calling thread (time.thread_time_ns, CLOCK_THREAD_CPUTIME_ID),
which is where the binding's own work happens and which the daemon's and the
other core's noise do not reach; and the whole lifecycle's wall time.
Python fills and reads through numpy.asarray (an array made and dropped per
step), C++ through the buffer's pointer.

Alternating lifecycle by lifecycle makes each path run with the other's code
in the caches, and the per-step timers cost a system call each; so the same
lifecycles are also run back to back, as a program that uses only one of
the two runs them: blocks of BLOCK lifecycles, Python and C++ alternating
block by block (drift still cancels), timed per block.

A control runs beside them: the C++ lifecycle called once per lifecycle
from a Python loop (one call and one GIL release per lifecycle, none of the
binding's lifecycle code). What it adds over the C++ loop is what going back
to Python between lifecycles costs by itself (caches, the daemon's and gRPC's
threads finding the client later), so it bounds what CPU time can resolve.

Both are CPU times, which on a shared machine vary from run to run;
--instructions counts instead (valgrind's callgrind, which that noise does
not reach): the instructions the client process executes per lifecycle,
Python and C++, each from two runs of N and 3N lifecycles (the difference
cancels start-up), the daemon running outside valgrind.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/python_bench.py
[--quick | --instructions]. Starts its own shmtensord from build/bin.
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing", "python"))
import shmtensor  # noqa: E402
# The C++ client, from the build tree's benchmark hooks (bench/python/hooks.cc).
from shmtensor._core import _bench  # noqa: E402

CppClient = _bench.CppClient
from shmtensor_testing import Daemon  # noqa: E402

NBYTES = 64 << 10
BLOCK = 200
HELD_BLOCK = 1000


STEPS = ("(timer)", "create", "fill", "seal", "get", "read", "release view",
         "release ref")


def py_lifecycle(c):
    """One Python lifecycle; returns (wall us, [thread CPU us per step])."""
    clock = time.thread_time_ns
    steps = []
    t0 = time.perf_counter()
    t = clock()

    def step():
        nonlocal t
        now = clock()
        steps.append((now - t) / 1e3)
        t = now

    step()  # Nothing: what timing a step costs.
    buf = c.create(NBYTES // 4, "float32")
    step()
    np.asarray(buf)[0] = 1.0
    step()
    ref = buf.seal()
    del buf
    step()
    view = c.get(ref)
    step()
    assert np.asarray(view)[0] == 1.0
    step()
    del view  # Releases without waiting, like the C++ scope exit.
    step()
    del ref
    step()
    return (time.perf_counter() - t0) * 1e6, steps


def py_block(c, n):
    """n Python lifecycles back to back (the steps of py_lifecycle, untimed);
    returns the thread CPU time in us."""
    clock = time.thread_time_ns
    t = clock()
    for _ in range(n):
        buf = c.create(NBYTES // 4, "float32")
        np.asarray(buf)[0] = 1.0
        ref = buf.seal()
        del buf
        view = c.get(ref)
        assert np.asarray(view)[0] == 1.0
        del view
        del ref
    return (clock() - t) / 1e3


def cpp_lifecycle(cpp):
    """One C++ lifecycle (timed inside C++), same return value."""
    return cpp.lifecycle(NBYTES)


def py_block_bare(c, n):
    """n Python lifecycles without the numpy fill and read: the calls the
    issue names (create, seal, get, release) and nothing else; returns the
    thread CPU time in us."""
    clock = time.thread_time_ns
    t = clock()
    for _ in range(n):
        buf = c.create(NBYTES // 4, "float32")
        ref = buf.seal()
        del buf
        view = c.get(ref)
        del view
        del ref
    return (clock() - t) / 1e3


def cpp_block_one_by_one(cpp, n):
    """The control: n C++ lifecycles, one CppClient.lifecycles call each from a
    Python loop (the loop, one call and one GIL release per lifecycle, and
    none of the binding's lifecycle code); returns the thread CPU time in
    us."""
    clock = time.thread_time_ns
    run = cpp.lifecycles
    t = clock()
    for _ in range(n):
        run(NBYTES, 1, False)
    return (clock() - t) / 1e3


def instructions_child(address, variant, n):
    """In a process under callgrind: 50 lifecycles to warm up, then n."""
    c = shmtensor.connect(address)
    cpp = CppClient(address)
    run = {"python": lambda k: py_block(c, k),
           "python, no numpy": lambda k: py_block_bare(c, k),
           "cpp": lambda k: cpp.lifecycles(NBYTES, k),
           "cpp, one call each": lambda k: cpp_block_one_by_one(cpp, k)}[variant]
    for k in (50, n):
        run(k)


def instructions():
    if shutil.which("valgrind") is None:
        print("--instructions needs valgrind (apt-get install valgrind)")
        return 1
    n, reps = 100, 3
    variants = ("python", "python, no numpy", "cpp", "cpp, one call each")
    runs = {v: [] for v in variants}
    with Daemon("512MiB") as d, tempfile.TemporaryDirectory() as tmp:
        # Rounds of all variants, taking the median per variant: the
        # client's threads meet gRPC's locks differently from run to run
        # (a spinning lock costs instructions), so single counts vary.
        for rep in range(reps):
            for variant in variants:
                total = {}
                for k in (n, 3 * n):
                    out = os.path.join(tmp, f"{variant}.{rep}.{k}")
                    r = subprocess.run(
                        ["valgrind", "--tool=callgrind",
                         f"--callgrind-out-file={out}", sys.executable,
                         os.path.abspath(__file__), "--instructions-child",
                         d.address, variant, str(k)],
                        capture_output=True, text=True,
                        # Fixed string hashes: the runs' start-ups (imports)
                        # then execute the same instructions and cancel out.
                        env=dict(os.environ, PYTHONHASHSEED="0"))
                    m = re.search(r"Collected : (\d+)", r.stderr)
                    if r.returncode != 0 or not m:
                        print(f"callgrind run failed ({variant}, {k}):\n"
                              f"{r.stderr}")
                        return 1
                    total[k] = int(m.group(1))
                runs[variant].append((total[3 * n] - total[n]) / (2 * n))
    per = {v: statistics.median(x) for v, x in runs.items()}
    cpp = per["cpp"]
    print(f"64 KiB lifecycle, instructions executed by the client process per "
          f"lifecycle (callgrind, {2 * n} lifecycles of difference, median "
          f"of {reps} rounds); C++ "
          f"{cpp:,.0f} (create, fill and read one element through the "
          f"pointer, seal, get, release view, release ref)")
    for variant, what in (
            ("python, no numpy", "Python, create, seal, get, release only"),
            ("python", "Python, the same, fill and read through "
                       "numpy.asarray"),
            ("cpp, one call each", "control: the C++ lifecycle called once "
                                   "per lifecycle from a Python loop")):
        py = per[variant]
        print(f"  {what}: {py:,.0f}, adds {py - cpp:+,.0f} "
              f"({py / cpp:.3f}x)")
    print("  rounds: " + "; ".join(
        f"{v} " + " ".join(f"{x:,.0f}" for x in runs[v]) for v in variants))
    return 0


def fast_path(c, hooks, n):
    """The fast path from Python (docs/shm_layout.md, "Stock and one-way
    seals"): put of a 64 KiB array against np.copyto of it into private
    memory (the copy alone, + 5 us: the goal is 1.2x of that), and a get of
    an object this process holds a view of (a share of its lease) from
    Python and from C++ (the goal: Python within 1.2x of C++). Wall time,
    p50; the puts' refs go as they are made."""
    src = np.ones(NBYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    put, copy = [], []
    for i in range(n + 100):
        t0 = time.perf_counter_ns()
        ref = c.put(src)
        t1 = time.perf_counter_ns()
        np.copyto(dst, src)
        t2 = time.perf_counter_ns()
        del ref
        if i >= 100:
            put.append((t1 - t0) / 1e3)
            copy.append((t2 - t1) / 1e3)
    # The same put of a torch tensor (over the same bytes), when torch is
    # installed: put() reads a tensor's layout through torch's Python API.
    # Its own copies alongside, as above: this VM's speed drifts between
    # loops.
    tput, tcopy = [], []
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        tsrc = torch.from_numpy(src.copy())
        for i in range(n + 100):
            t0 = time.perf_counter_ns()
            ref = c.put(tsrc)
            t1 = time.perf_counter_ns()
            np.copyto(dst, src)
            t2 = time.perf_counter_ns()
            del ref
            if i >= 100:
                tput.append((t1 - t0) / 1e3)
                tcopy.append((t2 - t1) / 1e3)
    ref = c.put(src)
    first = c.get(ref)
    # Blocks of HELD_BLOCK gets, each view dropped at once, each beside a
    # block of the C++ client's (timed the same way, hooks.cc) and, for the
    # floor of any call from Python, a block of calls of a builtin that
    # takes one object and makes a new one: this VM's speed drifts, and
    # moves Python's loop more than C++'s, so each Python block is divided
    # by the C++ block next to it.
    held, cpp_held, floor, ratio = [], [], [], []
    blocks = max(n // 10, 20)
    for i in range(blocks + 5):
        t0 = time.perf_counter_ns()
        for _ in range(HELD_BLOCK):
            c.get(ref)
        t1 = time.perf_counter_ns()
        for _ in range(HELD_BLOCK):
            id(ref)
        t2 = time.perf_counter_ns()
        cpp = hooks.gets_of_held(NBYTES, 1)[0]
        if i >= 5:
            held.append((t1 - t0) / HELD_BLOCK / 1e3)
            floor.append((t2 - t1) / HELD_BLOCK / 1e3)
            cpp_held.append(cpp)
            ratio.append(held[-1] / cpp)
    del first, ref
    med = statistics.median
    of_tensor = (f"; of a torch tensor {med(tput):.1f} us, copy alone "
                 f"{med(tcopy):.1f} us, {med(tput) / (med(tcopy) + 5):.2f}"
                 if tput else
                 " (no torch here for a tensor's)")
    return (f"fast path, 64 KiB, wall p50: put {med(put):.1f} us, copy alone "
            f"{med(copy):.1f} us, put/(copy + 5 us) "
            f"{med(put) / (med(copy) + 5):.2f}{of_tensor} (goal <= 1.2); "
            f"get of a held "
            f"object, per get in blocks of {HELD_BLOCK}: Python "
            f"{med(held) * 1e3:.0f} ns, C++ {med(cpp_held) * 1e3:.0f} ns, "
            f"{med(ratio):.2f}x (block by block; goal <= 1.2); the cheapest "
            f"call from Python (id(x) in the same loop) {med(floor) * 1e3:.0f}"
            f" ns, so Python / (C++ + that) "
            f"{med(held) / (med(cpp_held) + med(floor)):.2f}")



def main():
    if "--instructions-child" in sys.argv:
        i = sys.argv.index("--instructions-child")
        address, variant, n = sys.argv[i + 1:i + 4]
        instructions_child(address, variant, int(n))
        return
    if "--instructions" in sys.argv:
        sys.exit(instructions())
    iters = 500 if "--quick" in sys.argv else 4000
    with Daemon("512MiB") as d:
        c = shmtensor.connect(d.address)
        hooks = CppClient(d.address)
        py, cpp = [], []
        for i in range(iters + 100):
            p = py_lifecycle(c)
            q = cpp_lifecycle(hooks)
            if i >= 100:  # Warm-up done.
                py.append(p)
                cpp.append(q)
        rounds = 10 if "--quick" in sys.argv else 40
        blocks_py, blocks_bare, blocks_cpp, blocks_ctl = [], [], [], []
        for r in range(rounds + 2):
            p = py_block(c, BLOCK) / BLOCK
            b = py_block_bare(c, BLOCK) / BLOCK
            q = hooks.lifecycles(NBYTES, BLOCK) / BLOCK
            k = cpp_block_one_by_one(hooks, BLOCK) / BLOCK
            if r >= 2:  # Warm-up done.
                blocks_py.append(p)
                blocks_bare.append(b)
                blocks_cpp.append(q)
                blocks_ctl.append(k)
        fast = fast_path(c, hooks, 500 if "--quick" in sys.argv else 3000)
    med = statistics.median
    print(fast)
    print(f"64 KiB lifecycle, {iters} pairs (C++ and Python alternate); "
          f"thread CPU p50 per step, us")
    print(f"{'step':14} {'C++':>8} {'Python':>8} {'paired diff':>12}")
    for k, name in enumerate(STEPS):
        print(f"{name:14} {med(q[1][k] for q in cpp):8.1f} "
              f"{med(p[1][k] for p in py):8.1f} "
              f"{med(p[1][k] - q[1][k] for p, q in zip(py, cpp)):+12.1f}")
    # The lifecycle without the timer's own cost (the "(timer)" step, once
    # per step).
    timed = len(STEPS) - 1
    total = ([sum(x[1][1:]) - timed * x[1][0] for x in cpp],
             [sum(x[1][1:]) - timed * x[1][0] for x in py])
    print(f"{'whole - timer':14} {med(total[0]):8.1f} {med(total[1]):8.1f} "
          f"{med(b - a for a, b in zip(*total)):+12.1f}")
    print(f"{'wall p50':14} {med(q[0] for q in cpp):8.1f} "
          f"{med(p[0] for p in py):8.1f} "
          f"{med(p[0] - q[0] for p, q in zip(py, cpp)):+12.1f}")
    rpc = [STEPS.index(s) for s in ("create", "seal", "get")]
    per_call = med(sum((p[1][k] - p[1][0]) - (q[1][k] - q[1][0]) for k in rpc)
                   / len(rpc) for p, q in zip(py, cpp))
    print(f"binding overhead: {med(b - a for a, b in zip(*total)):+.1f} us of "
          f"CPU per lifecycle ({med(total[1]) / med(total[0]):.3f}x), of "
          f"which {per_call:+.1f} us per RPC call (create, seal, get)")
    print(f"back to back, {rounds} rounds of blocks of {BLOCK} lifecycles "
          f"(the four in turn); thread CPU per lifecycle, p50 of the rounds:")
    print(f"  {'C++ (fill and read through the pointer)':58} "
          f"{med(blocks_cpp):7.1f} us")
    for name, blocks in (
            ("Python, create/seal/get/release only", blocks_bare),
            ("Python, fill and read through numpy", blocks_py),
            ("control: C++ called once per lifecycle from Python",
             blocks_ctl)):
        print(f"  {name:58} {med(blocks):7.1f} us, paired diff "
              f"{med(b - a for a, b in zip(blocks_cpp, blocks)):+5.1f} us "
              f"({med(blocks) / med(blocks_cpp):.3f}x)")


if __name__ == "__main__":
    main()
