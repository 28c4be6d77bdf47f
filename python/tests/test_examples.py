"""The examples run as documented, against a real daemon."""

import os
import re
import subprocess
import sys

from conftest import REPO, child_env


def test_train_dataloader_example_trains_and_runs_the_own_loop(daemon):
    env = child_env(SHMTENSOR_ADDRESS=daemon.address)
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "train_dataloader.py")],
        env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out.stdout)]
    assert losses[-1] < losses[0], out.stdout  # It learns.
    assert out.stdout.count("own loop: batch (256, 2)") == 4, out.stdout
