#!/usr/bin/env python3
"""torch's own DataLoader tests, against torch's DataLoader and against ours.

Runs the installed torch's test/test_dataloader.py twice, side by side:
once as it is (which tests torch itself passes on this machine) and once
with torch.utils.data.DataLoader rebound to shmtensor.torch.DataLoader, the
only change (rebind/sitecustomize.py, in the test process and in every
interpreter its tests start). Fails if a test that torch passes does not
pass with ours; such a test is run once more on its own first, as torch's
suite has timing-sensitive tests and the two runs share the machine.

Which test file: --test-file; else the copy kept here for the installed
torch version (pytorch-<version>/, taken from Debian's pytorch source
package; PyTorch's BSD license is LICENSE.pytorch); else the installed
torch's source package, fetched with `apt-get source --download-only
pytorch` (needs a deb-src line in apt's sources), so a torch we keep no copy
for is checked the same way. When there is none: exit 77 (skipped), naming
the version.

torchdata's StatefulDataLoader the same way: --rebind StatefulDataLoader
--test-file F, F a file of torchdata's test/stateful_dataloader (of the
installed torchdata's release), run once as it is and once with
torchdata.stateful_dataloader.StatefulDataLoader rebound to shmtensor's
(deploy/test-pypi.sh runs those).

A file that does not run its tests when run as a script (torchdata 0.11's
test_sampler.py calls a run_tests it does not import) runs under
--runner unittest (`python -m unittest`; its tests' ids then start with
the module's name, not __main__).

Usage: run.py [--test-file F] [--rebind DataLoader|StatefulDataLoader]
[--runner script|unittest] [--only torch|ours] [--timeout S] [TEST ...]
(TEST: unittest names, e.g. TestDataLoader.test_sequential_workers). The
daemon and Python package come from the build tree ($SHMTENSOR_DAEMON and
$SHMTENSOR_PYTHONPATH, as for the pytest files).
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
SKIPPED = 77  # ctest's SKIP_RETURN_CODE for this entry.


# -- the parent: both runs and the comparison ----------------------------------

def _torch_version(python):
    """The installed torch's upstream version: of its Debian package where
    dpkg installed it (Debian's 1.13.1 calls itself 1.13.0a0), else its
    own."""
    r = subprocess.run([python, "-c", "import torch; print(torch.__file__); "
                        "print(torch.__version__)"],
                       capture_output=True, text=True, check=True)
    path, version = r.stdout.split()
    if shutil.which("dpkg-query"):
        owner = subprocess.run(["dpkg-query", "-S", path], capture_output=True,
                               text=True)
        if owner.returncode == 0:
            package = owner.stdout.split(":")[0]
            v = subprocess.run(["dpkg-query", "-W", "-f=${Version}",
                                package], capture_output=True, text=True)
            if v.returncode == 0 and v.stdout:
                version = v.stdout.split(":")[-1]
    return version.split("+")[0].split("-")[0]


def _from_source_package(version, work):
    """test/test_dataloader.py of the installed torch's Debian source
    package, or None (no deb-src, another version, no apt)."""
    if shutil.which("apt-get") is None:
        return None
    src = os.path.join(work, "source")
    os.makedirs(src)
    r = subprocess.run(["apt-get", "source", "--download-only", "pytorch"],
                       cwd=src, capture_output=True, text=True)
    tars = glob.glob(os.path.join(src, f"pytorch_{version}*.orig.tar.*"))
    if not tars:
        print(f"torch-suite: no source package of torch {version} "
              f"(apt-get source: {r.stderr.strip()[-300:]})")
        return None
    with tarfile.open(tars[0]) as tar:
        for member in tar:
            if member.name.endswith("/test/test_dataloader.py"):
                tar.extract(member, src)
                return os.path.join(src, member.name)
    return None


def _find_test_file(args, version, work):
    if args.test_file:
        return args.test_file, args.test_file
    kept = os.path.join(HERE, f"pytorch-{version}", "test_dataloader.py")
    if os.path.exists(kept):
        return kept, f"the copy in python/tests/torch_suite/pytorch-{version}"
    found = _from_source_package(version, work)
    if found:
        return found, "Debian's pytorch source package"
    return None, None


def _environment(mode, address, python, results, rebind):
    pythonpath = [os.path.join(HERE, "rebind"), _package_dir()]
    if subprocess.run([python, "-c", "import expecttest"],
                      capture_output=True).returncode != 0:
        pythonpath.append(os.path.join(HERE, "standin"))
    env = dict(os.environ)
    # torch's test utilities take $CI for PyTorch's own CI (XML reports
    # through xmlrunner, which Debian does not package): not ours.
    env.pop("CI", None)
    env.update(SHMTENSOR_TORCH_SUITE=mode, SHMTENSOR_TORCH_SUITE_REBIND=rebind,
               SHMTENSOR_TORCH_SUITE_RESULTS=results,
               SHMTENSOR_ADDRESS=address,
               PYTHONPATH=os.pathsep.join(pythonpath))
    return env


def _package_dir():
    return os.environ.get("SHMTENSOR_PYTHONPATH",
                          os.path.join(os.path.dirname(os.path.dirname(TESTS)),
                                       "build", "python"))


def _start(mode, test_file, work, address, names, python, rebind, runner,
           tag=""):
    results = os.path.join(work, f"{mode}{tag}.jsonl")
    log = open(os.path.join(work, f"{mode}{tag}.log"), "w")
    if runner == "unittest":
        module = os.path.splitext(os.path.basename(test_file))[0]
        command = [python, "-m", "unittest", *(names or [module])]
    else:
        command = [python, test_file, *names]
    proc = subprocess.Popen(
        command,
        cwd=work, env=_environment(mode, address, python, results, rebind),
        stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    return proc, results, log.name


def _wait(proc, deadline):
    try:
        proc.wait(timeout=max(1, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return False


def _outcomes(results):
    """test id -> pass / fail / skip (a test that started and recorded
    nothing else, as when the run was killed in it: fail); and whether the
    run finished."""
    outcome, done = {}, False
    rank = {"start": 0, "skip": 1, "pass": 2, "fail": 3}
    if not os.path.exists(results):
        return outcome, done
    with open(results) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # A line cut short by a kill.
            if rec["event"] == "done":
                done = True
                continue
            old = outcome.get(rec["id"], "start")
            if rank[rec["event"]] >= rank[old]:
                outcome[rec["id"]] = rec["event"]
    return ({k: ("fail" if v == "start" else v) for k, v in outcome.items()},
            done)


def _left_in_pool(address, timeout=10.0):
    """What the pool still holds (objects, bytes) after a run whose processes
    are all gone, as text; "" when it is empty. Waits up to `timeout` for
    the daemon to reap the last sessions."""
    import shmtensor
    client = shmtensor.connect(address)
    deadline = time.monotonic() + timeout
    while True:
        stats = client.stats()
        # This client's session is the only one left.
        objects, used = stats["objects"], stats["pools"][0]["used_bytes"]
        if (objects == 0 and used == 0) or time.monotonic() > deadline:
            return "" if objects == 0 and used == 0 else (
                f"{objects} objects, {used} bytes")
        time.sleep(0.1)


def _counts(outcome):
    values = list(outcome.values())
    return (len(values), values.count("pass"), values.count("fail"),
            values.count("skip"))


def _tail(path, n=60):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


class _Report:
    """The summary: printed as it comes, and kept for --report."""

    def __init__(self):
        self.lines = []

    def __call__(self, line=""):
        print(line, flush=True)
        self.lines.append(line)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--test-file")
    p.add_argument("--only", choices=("torch", "ours"))
    p.add_argument("--runner", choices=("script", "unittest"),
                   default="script",
                   help="how the file's tests run: the file as a script, "
                   "or python -m unittest")
    p.add_argument("--rebind", choices=("DataLoader", "StatefulDataLoader"),
                   default="DataLoader",
                   help="the loader class the run with ours replaces")
    p.add_argument("--timeout", type=float, default=1200,
                   help="seconds for each whole run")
    p.add_argument("--report", help="also write the summary to this file")
    p.add_argument("names", nargs="*")
    args = p.parse_args()
    say = _Report()
    try:
        return _run(args, say)
    finally:
        if args.report:
            with open(args.report, "w") as f:
                f.write("\n".join(say.lines) + "\n")


def _run(args, say):
    python = sys.executable
    version = _torch_version(python)
    work = tempfile.mkdtemp(prefix="shmtensor-torch-suite-")
    if args.rebind == "StatefulDataLoader" and not args.test_file:
        say("torch-suite: StatefulDataLoader needs --test-file (a file of "
            "torchdata's test/stateful_dataloader)")
        return 2
    test_file, origin = _find_test_file(args, version, work)
    if test_file is None:
        say(f"torch-suite: SKIPPED: no test_dataloader.py for torch "
            f"{version} (no copy in python/tests/torch_suite, no source package); "
            f"pass --test-file")
        return SKIPPED
    local = os.path.join(work, os.path.basename(test_file))
    shutil.copy(test_file, local)

    sys.path.insert(0, TESTS)
    from conftest import Daemon  # noqa: E402 - the pytest files' daemon.
    daemon = Daemon(pool_size="1GiB")
    modes = [args.only] if args.only else ["torch", "ours"]
    try:
        started = time.monotonic()
        runs = {m: _start(m, local, work, daemon.address, args.names, python,
                          args.rebind, args.runner)
                for m in modes}
        deadline = started + args.timeout
        killed = {m: not _wait(runs[m][0], deadline) for m in modes}
        took = time.monotonic() - started
        outcomes, finished = {}, {}
        for m in modes:
            outcomes[m], done = _outcomes(runs[m][1])
            finished[m] = done and not killed[m]

        say(f"torch {version}: {os.path.basename(test_file)} from {origin}, "
            f"{args.rebind}; "
            f"both runs side by side in {took:.0f} s")
        say(f"{'DataLoader':<12}{'tests':>7}{'passed':>8}{'failed':>8}"
            f"{'skipped':>9}  finished")
        for m in modes:
            name = {"torch": "theirs", "ours": "shmtensor"}[m]
            counts = "".join(f"{n:>{w}}" for n, w in
                             zip(_counts(outcomes[m]), (7, 8, 8, 9)))
            say(f"{name:<12}{counts}  {'yes' if finished[m] else 'NO'}")
        if len(modes) == 1:
            ok = finished[modes[0]] and _counts(outcomes[modes[0]])[2] == 0
            if not ok:
                say(_tail(runs[modes[0]][2]))
            return 0 if ok else 1

        theirs, ours = outcomes["torch"], outcomes["ours"]
        if not finished["torch"] or _counts(theirs)[1] == 0:
            # Nothing to compare with: say so rather than pass.
            say("their own run did not finish or passed nothing:\n" +
                _tail(runs["torch"][2]))
            say(f"logs kept in {work}")
            return 1
        suspects = sorted(t for t, o in theirs.items()
                          if o == "pass" and ours.get(t) != "pass")
        regressions = []
        if not finished["ours"]:
            # A hang or a crash of ours: no test alone excuses it.
            say("shmtensor's run did not finish:\n" + _tail(runs["ours"][2]))
            say(f"logs kept in {work}")
            return 1
        for t in suspects:  # Once more, alone, before it counts.
            name = t.split(".", 1)[1] if t.startswith("__main__.") else t
            proc, res, log = _start("ours", local, work, daemon.address,
                                    [name], python, args.rebind,
                                    args.runner, tag="-" + name)
            _wait(proc, time.monotonic() + 300)
            if _outcomes(res)[0].get(t) != "pass":
                regressions.append((t, log))
        better = sorted(t for t, o in ours.items()
                        if o == "pass" and theirs.get(t) == "fail")
        if suspects:
            say(f"failed with ours in the full run, passed alone: "
                f"{len(suspects) - len(regressions)} of {len(suspects)}")
            # Named, with what the full run made of each, so that a test
            # that fails only under the doubled load can be told apart
            # from one that fails at random afterwards.
            failed_alone = {t for t, _ in regressions}
            for t in suspects:
                if t not in failed_alone:
                    say(f"  {t}: {ours.get(t, 'not run')} in the full run")
        if better:
            say("theirs fails, ours passes: " + ", ".join(better))
        both_fail = sorted(t for t, o in theirs.items()
                           if o == "fail" and ours.get(t) == "fail")
        if both_fail:
            say("fail with theirs too (not counted): " +
                ", ".join(both_fail))
        left = _left_in_pool(daemon.address)
        if left:
            say(f"shmtensor's run left {left} in the pool once every test "
                f"and worker was gone")
            return 1
        if regressions:
            say("theirs passes, ours does not:")
            for t, log in regressions:
                say(f"--- {t} (log: {log})\n{_tail(log)}")
            say(f"logs kept in {work}")
            return 1
        say("every test theirs passes passes with shmtensor's")
        shutil.rmtree(work, ignore_errors=True)
        return 0
    finally:
        daemon.kill()


if __name__ == "__main__":
    sys.exit(main())
