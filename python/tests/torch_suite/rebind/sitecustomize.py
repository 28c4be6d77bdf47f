"""In every Python process of a torch-suite run (run.py puts this directory
on PYTHONPATH for that run only; it shadows the interpreter's own
sitecustomize, which on Debian installs only apport's exception hook):

- $SHMTENSOR_TORCH_SUITE=ours: torch.utils.data.DataLoader is rebound to
  shmtensor's, in the test process and in the interpreters its tests start
  with `python -c "from torch.utils.data import DataLoader ..."`; or, with
  $SHMTENSOR_TORCH_SUITE_REBIND=StatefulDataLoader, torchdata's
  StatefulDataLoader (torchdata.stateful_dataloader's name, where its tests
  import it from);
- $SHMTENSOR_TORCH_SUITE_RESULTS: each test's start and outcome is appended
  to that file as a JSON line (only the test process runs tests), so a run
  that is killed still tells what it did.
"""

import os

if os.environ.get("SHMTENSOR_TORCH_SUITE") == "ours":
    import shmtensor.torch

    if os.environ.get("SHMTENSOR_TORCH_SUITE_REBIND") == "StatefulDataLoader":
        import torchdata.stateful_dataloader

        torchdata.stateful_dataloader.StatefulDataLoader = (
            shmtensor.torch.StatefulDataLoader)
    else:
        import torch.utils.data

        torch.utils.data.DataLoader = shmtensor.torch.DataLoader


def _record(path):
    import json
    import unittest.result

    out = open(path, "a", buffering=1)

    def note(test, event):
        out.write(json.dumps({"id": test.id(), "event": event}) + "\n")

    base = unittest.result.TestResult
    events = {"startTest": "start", "addSuccess": "pass",
              "addFailure": "fail", "addError": "fail", "addSkip": "skip",
              "addExpectedFailure": "pass", "addUnexpectedSuccess": "fail"}
    for method, event in events.items():
        def hook(self, test, *args, _orig=getattr(base, method), _e=event):
            note(test, _e)
            return _orig(self, test, *args)
        setattr(base, method, hook)
    orig_sub = base.addSubTest

    def add_sub_test(self, test, subtest, err):
        if err is not None:
            note(test, "fail")
        return orig_sub(self, test, subtest, err)
    base.addSubTest = add_sub_test

    def stop_test_run(self, _orig=base.stopTestRun):
        out.write(json.dumps({"id": None, "event": "done"}) + "\n")
        return _orig(self)
    base.stopTestRun = stop_test_run


if os.environ.get("SHMTENSOR_TORCH_SUITE_RESULTS"):
    _record(os.environ.pop("SHMTENSOR_TORCH_SUITE_RESULTS"))
