"""setuptools driving CMake: the package build where scikit-build-core is
missing (Debian 12; python/build_backend/shmtensor_build.py decides). The
metadata and the CMake options are pyproject.toml's; this file only builds
the CMake project and installs its `python` component (the binding _core,
shmtensor/bin/shmtensord, shmtensor/bin/shmtensorctl) where setuptools
assembles the wheel. With $SHMTENSOR_FROM_BUILD_TREE=DIR it installs the
component from that existing build tree instead of building
(python/build_backend/build_tree.py).
"""

import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "python", "build_backend"))
import build_tree  # noqa: E402


def _pyproject():
    import tomllib  # Python 3.11+ (requires-python).
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _cmake_build_dir():
    """Kept between builds, so a rebuild compiles only what changed:
    scikit-build-core's build-dir ($SKBUILD_BUILD_DIR, as scikit-build-core
    reads it, else pyproject.toml's), {wheel_tag} made setuptools-<tag>."""
    tag = f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"
    build_dir = (os.environ.get("SKBUILD_BUILD_DIR") or
                 _pyproject()["tool"]["scikit-build"]["build-dir"])
    return os.path.join(ROOT, build_dir.replace("{wheel_tag}",
                                                f"setuptools-{tag}"))


# setuptools' own staging (build_lib, egg-info) beside the CMake build, out
# of the source tree.
STAGING = _cmake_build_dir() + "-staging"
os.makedirs(STAGING, exist_ok=True)


class CMakeExtension(Extension):
    """The binding, built by CMake rather than by setuptools' compiler."""

    def __init__(self, name):
        super().__init__(name, sources=[])


class FreshBuild(build):
    """Assembles the wheel's tree afresh each time: a file removed from the
    package must not linger in the next wheel."""

    def run(self):
        shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        prebuilt = build_tree.requested()
        if prebuilt:
            build_tree.check(prebuilt, ROOT)
            build_tree.install(prebuilt, os.path.abspath(self.build_lib))
        else:
            self._build_and_install()
        built = self.get_ext_fullpath(ext.name)
        if not os.path.exists(built):
            raise RuntimeError(
                f"CMake installed no {built}: is the binding built for "
                f"{sys.executable}?")

    def _build_and_install(self):
        skbuild = _pyproject()["tool"]["scikit-build"]
        build_dir = _cmake_build_dir()
        defines = dict(skbuild.get("cmake", {}).get("define", {}))
        defines.update(CMAKE_BUILD_TYPE=skbuild["cmake"]["build-type"],
                       PYTHON_EXECUTABLE=sys.executable)
        configure = ["cmake", "-S", ROOT, "-B", build_dir]
        configure += [f"-D{k}={v}" for k, v in sorted(defines.items())]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", build_dir, "-j", jobs], check=True)
        # The binding lands where setuptools expects the extension
        # (build_lib/shmtensor/_core.<suffix>), the binaries beside it.
        subprocess.run(["cmake", "--install", build_dir, "--component",
                        "python", "--prefix", os.path.abspath(self.build_lib)],
                       check=True)


setup(ext_modules=[CMakeExtension("shmtensor._core")],
      cmdclass={"build": FreshBuild, "build_ext": CMakeBuild},
      options={"build": {"build_base": STAGING},
               "egg_info": {"egg_base": STAGING}})
