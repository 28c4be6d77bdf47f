"""Packaging what an existing CMake build tree of this source built, instead
of building the C++ tree a second time ($SHMTENSOR_FROM_BUILD_TREE; the
test suite's install does this with ./deploy/build.sh's build/).

It is sound only where the tree's `python` component is what a package
build of this source would make, for this interpreter. `check` refuses,
naming the reason, a tree that is not of this source, has no Python binding,
or is older than its sources (it would package stale binaries: it does not
build them, since tests may be running from that tree); the package build
then checks the binding is built for this interpreter's extension suffix.
The tree's build type (RelWithDebInfo for build/) differs from a package
build's Release; the install strips the debug information.
"""

import os
import re
import subprocess

ENV = "SHMTENSOR_FROM_BUILD_TREE"

# What the `python` component installs (python/CMakeLists.txt).
TARGETS = ["shmtensor_python", "shmtensord", "shmtensorctl"]

# The progress messages of CMake's Makefile generator for a rule that would
# run: a dry run (make -n) prints them for exactly the work left.
_MAKE_WORK = re.compile(r'cmake_echo_color .*"((Building|Linking|Generating) [^"]*)"')


class StaleTree(RuntimeError):
    pass


def requested():
    """The build tree named by $SHMTENSOR_FROM_BUILD_TREE, or None."""
    value = os.environ.get(ENV, "")
    return os.path.abspath(value) if value else None


def _cache(build_dir):
    path = os.path.join(build_dir, "CMakeCache.txt")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise RuntimeError(f"{ENV}={build_dir[:200]!r}: no CMake build tree "
                           f"there ({e.strerror})") from e
    entries = {}
    for line in text.splitlines():
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*):[A-Z]+=(.*)$", line)
        if m:
            entries[m.group(1)] = m.group(2)
    return entries


def _newest_cmake_file(root):
    """The newest CMakeLists.txt or *.cmake(.in) of the project (examples/
    is a project of its own; debian/ and build trees are not sources)."""
    newest, which = 0.0, None
    for path, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(("build", "."))
                      and not (path == root and d in ("examples", "debian"))]
        for f in files:
            if f == "CMakeLists.txt" or f.endswith((".cmake", ".cmake.in")):
                t = os.stat(os.path.join(path, f)).st_mtime
                if t > newest:
                    newest, which = t, os.path.join(path, f)
    return newest, which


def _work_left(build_dir, generator):
    """What a build of TARGETS would still do ('' when nothing)."""
    if generator == "Ninja":
        out = subprocess.run(["ninja", "-C", build_dir, "-n"] + TARGETS,
                             capture_output=True, text=True, check=True)
        if "no work to do" in out.stdout:
            return ""
        return out.stdout.strip().splitlines()[-1][:200]
    if generator == "Unix Makefiles":
        out = subprocess.run(["make", "-C", build_dir, "-n"] + TARGETS,
                             capture_output=True, text=True, check=True)
        work = [m.group(1) for m in map(_MAKE_WORK.search,
                                        out.stdout.splitlines()) if m]
        return "; ".join(work[:3])[:200]
    raise RuntimeError(f"{ENV}: cannot tell whether a {generator[:64]!r} "
                       f"build tree is up to date; use Unix Makefiles or "
                       f"Ninja, or let pip build")


def check(build_dir, root):
    """Raises (naming why) unless build_dir is an up-to-date build tree of
    the source tree root with the Python binding in it."""
    cache = _cache(build_dir)
    source = cache.get("CMAKE_HOME_DIRECTORY", "")
    if os.path.realpath(source) != os.path.realpath(root):
        raise RuntimeError(f"{ENV}={build_dir[:200]!r} is a build tree of "
                           f"{source[:200]!r}, not of {root[:200]!r}")
    if cache.get("SHMTENSOR_WITH_PYTHON", "ON").upper() in ("OFF", "0", "NO",
                                                            "FALSE"):
        raise RuntimeError(f"{ENV}={build_dir[:200]!r} was configured with "
                           f"SHMTENSOR_WITH_PYTHON=OFF: it has no binding")
    generator = cache.get("CMAKE_GENERATOR", "")
    # A CMakeLists.txt newer than the generated build system: the dry run
    # below would answer from the old one.
    stamp = os.path.join(build_dir, "build.ninja" if generator == "Ninja"
                         else "Makefile")
    configured = os.stat(stamp).st_mtime if os.path.exists(stamp) else 0.0
    newest, which = _newest_cmake_file(root)
    if newest > configured:
        raise StaleTree(f"{ENV}={build_dir[:200]!r} is older than "
                        f"{os.path.relpath(which, root)[:200]}: build it "
                        f"(./deploy/build.sh) or unset {ENV}")
    work = _work_left(build_dir, generator)
    if work:
        raise StaleTree(f"{ENV}={build_dir[:200]!r} is older than its "
                        f"sources ({work}): build it (./deploy/build.sh) or "
                        f"unset {ENV}")


def install(build_dir, prefix):
    """Installs the tree's `python` component under prefix, stripped."""
    subprocess.run(["cmake", "--install", build_dir, "--component", "python",
                    "--prefix", prefix, "--strip"], check=True)
