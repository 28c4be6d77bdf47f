"""The package as pip installs it (pyproject.toml): in a virtualenv, with no
PYTHONPATH, its commands on PATH, a DataLoader with workers giving torch's
batches with a daemon given and with one it starts itself; `pip wheel`
makes a wheel that installs, and `pip uninstall` removes every file.

Run against an installed copy ($SHMTENSOR_TEST_INSTALLED=1, as ctest does);
skipped on the build tree's package."""

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import INSTALLED, REPO, child_env

pytestmark = pytest.mark.skipif(
    not INSTALLED, reason="tests the pip-installed package "
    "(SHMTENSOR_TEST_INSTALLED=1 in a virtualenv)")

JOB = r"""
import os, sys
import numpy as np
import torch
import shmtensor
import shmtensor.torch

assert "PYTHONPATH" not in os.environ
print("from", shmtensor.__file__)
c = shmtensor.connect()
ref = c.put(np.arange(12, dtype=np.float32).reshape(3, 4))
assert np.array_equal(np.asarray(c.get(ref)), np.arange(12).reshape(3, 4))

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 37
    def __getitem__(self, i):
        return {"x": torch.full((3, 5), float(i)), "y": i * i}

def batches(cls, **kw):
    return list(cls(Squares(), batch_size=4, num_workers=2, **kw))

if __name__ == "__main__":
    for context in sys.argv[1:]:
        kw = {} if context == "default" else {"multiprocessing_context": context}
        ours = batches(shmtensor.torch.DataLoader, **kw)
        theirs = batches(torch.utils.data.DataLoader, **kw)
        assert len(ours) == len(theirs) == 10
        for a, b in zip(ours, theirs):
            assert a.keys() == b.keys()
            assert torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])
            assert a["x"].dtype == b["x"].dtype and a["y"].dtype == b["y"].dtype
        del ours
        print("batches equal", context)
    print("daemon", shmtensor._autostart.private_daemon() is not None)
"""


def venv_env(**extra):
    env = child_env(**extra)
    env.pop("PYTHONPATH", None)
    return env


def test_imports_from_the_environment_with_its_commands_on_path():
    import shmtensor
    site = sysconfig.get_paths()["purelib"]
    assert sys.prefix != sys.base_prefix, "not in a virtualenv"
    assert os.path.dirname(os.path.abspath(shmtensor.__file__)) == \
        os.path.join(site, "shmtensor")
    bindir = os.path.join(sys.prefix, "bin")
    for command in ("shmtensord", "shmtensorctl"):
        found = shutil.which(command, path=bindir)
        assert found == os.path.join(bindir, command)
        out = subprocess.run([found, "--help"], capture_output=True,
                             text=True, timeout=60, env=venv_env())
        assert out.returncode == 0, out.stderr
        assert command in out.stdout
        # The binary itself is inside the package.
        assert os.access(os.path.join(site, "shmtensor", "bin", command),
                         os.X_OK)
    from importlib import metadata
    assert metadata.version("shmtensor") == shmtensor.__version__


def run_job(tmp_path, env, *contexts):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    return subprocess.run([sys.executable, str(job), *contexts], env=env,
                          capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))


def test_the_package_ships_no_benchmark_hooks():
    """The benchmarks' C++ hooks (bench/python/hooks.cc) exist only in a
    build tree's binding built with the benchmarks, never in a package; the
    package has its subpackages."""
    import shmtensor
    import shmtensor.dataloader as dataloader  # The subpackage is installed.
    assert not hasattr(shmtensor._core, "_bench")
    assert {"DataLoader", "PoolCollate", "to_tensors"} <= set(dataloader.__all__)


def test_dataloader_with_a_daemon_given(tmp_path, daemon):
    out = run_job(tmp_path, venv_env(SHMTENSOR_ADDRESS=daemon.address),
                  "default")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "batches equal default" in out.stdout
    assert "daemon False" in out.stdout
    assert f"from {sys.prefix}" in out.stdout


def test_dataloader_with_a_daemon_it_starts(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = venv_env(XDG_RUNTIME_DIR=str(run), SHMTENSOR_POOL_SIZE="256MiB")
    env.pop("SHMTENSOR_ADDRESS", None)
    out = run_job(tmp_path, env, "default", "spawn", "forkserver")
    assert out.returncode == 0, out.stdout + out.stderr
    for context in ("default", "spawn", "forkserver"):
        assert f"batches equal {context}" in out.stdout, out.stdout
    assert "daemon True" in out.stdout
    assert out.stderr.count("started a private shmtensord") == 1, out.stderr
    assert os.listdir(run) == []  # Its socket directory went with it.


def pip_wheel(tmp_path, env):
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
         "--no-deps", "--no-index", "--disable-pip-version-check",
         "-w", str(tmp_path / "wheels"), REPO],
        capture_output=True, text=True, timeout=600, env=env)


BUILD_TREE = os.environ.get("SHMTENSOR_FROM_BUILD_TREE", "")


@pytest.mark.skipif(not BUILD_TREE, reason="the package is built from a "
                    "build tree only where $SHMTENSOR_FROM_BUILD_TREE names "
                    "one (ctest)")
def test_a_build_tree_is_packaged_only_when_it_is_this_sources_up_to_date(
        tmp_path):
    """The suite's install packages ./deploy/build.sh's binaries: a package
    of stale binaries or of another tree's would pass every test and ship
    something else. Each refusal names why; no wheel is made."""
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "CMakeCache.txt").write_text(
        "CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere/shmtensor\n"
        "CMAKE_GENERATOR:INTERNAL=Unix Makefiles\n")
    out = pip_wheel(tmp_path, venv_env(SHMTENSOR_FROM_BUILD_TREE=str(foreign)))
    assert out.returncode != 0
    assert "is a build tree of '/elsewhere/shmtensor'" in out.stdout + out.stderr

    out = pip_wheel(tmp_path, venv_env(
        SHMTENSOR_FROM_BUILD_TREE=str(tmp_path / "none")))
    assert out.returncode != 0
    assert "no CMake build tree there" in out.stdout + out.stderr

    # A source of the binding newer than its object, then a CMakeLists.txt
    # newer than the generated build system; each put back after.
    for source, says in (("client/client_core.cc", "client_core.cc.o"),
                         ("client/CMakeLists.txt", "client/CMakeLists.txt")):
        path = os.path.join(REPO, source)
        before = os.stat(path)
        try:
            os.utime(path)
            out = pip_wheel(tmp_path, venv_env())
        finally:
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert out.returncode != 0, source
        assert "is older than" in out.stdout + out.stderr, out.stderr[-2000:]
        assert says in out.stdout + out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "wheels").exists() or \
        os.listdir(tmp_path / "wheels") == []


def test_a_wheel_installs_and_uninstalls_cleanly(tmp_path):
    wheels = tmp_path / "wheels"
    # As the install was made: from the build tree under ctest, else in the
    # same build directory as the install (only what changed compiles).
    out = pip_wheel(tmp_path, venv_env())
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    (wheel,) = os.listdir(wheels)
    tag = sys.implementation.cache_tag.replace("cpython-", "cp")
    assert wheel.startswith("shmtensor-0.1.0-") and f"-{tag}-" in wheel, wheel

    venv = tmp_path / "venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv",
                    "--system-site-packages", str(venv)], check=True,
                   timeout=300)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    before = set(os.listdir(site)) | {"bin:" + n for n in os.listdir(venv / "bin")}
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    out = subprocess.run(pip + ["install", "--no-index", str(wheels / wheel)],
                         capture_output=True, text=True, timeout=300,
                         env=venv_env())
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(
        [python, "-c", "import shmtensor, numpy as np, shmtensor._commands as c;"
         "print(shmtensor.__file__); print(c.binary('shmtensord'))"],
        capture_output=True, text=True, timeout=60, env=venv_env(),
        cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(site), out.stdout
    out = subprocess.run([str(venv / "bin" / "shmtensorctl"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "shmtensorctl" in out.stdout, out.stderr

    out = subprocess.run(pip + ["uninstall", "-y", "shmtensor"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    after = set(os.listdir(site)) | {"bin:" + n for n in os.listdir(venv / "bin")}
    assert after == before, sorted(after ^ before)
