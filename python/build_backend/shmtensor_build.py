"""The PEP 517 build backend of pyproject.toml: scikit-build-core where it
is installed (Debian 13 packages it), else setuptools with setup.py driving
CMake (Debian 12 has no scikit-build-core). Both build the same CMake
project with the options in pyproject.toml's [tool.scikit-build.cmake.define]
and install its `python` component (the binding, shmtensord, shmtensorctl)
into the package.

$SHMTENSOR_BUILD_BACKEND=setuptools or =scikit-build-core picks one (the
latter fails where it is missing) so either can be checked where both exist.

$SHMTENSOR_FROM_BUILD_TREE=DIR packages what the CMake build tree DIR of
this source built (build_tree.py says when that is sound) instead of
building again: setuptools does it (scikit-build-core always builds).
"""

import os

import build_tree

__all__ = ["build_wheel", "build_sdist", "get_requires_for_build_wheel",
           "get_requires_for_build_sdist", "prepare_metadata_for_build_wheel"]


def _backend():
    wanted = os.environ.get("SHMTENSOR_BUILD_BACKEND", "")
    if wanted not in ("", "setuptools", "scikit-build-core"):
        raise RuntimeError(
            f"SHMTENSOR_BUILD_BACKEND={wanted[:64]!r}: use setuptools or "
            f"scikit-build-core")
    if build_tree.requested():
        if wanted == "scikit-build-core":
            raise RuntimeError(
                f"{build_tree.ENV} packages an existing build with "
                f"setuptools; SHMTENSOR_BUILD_BACKEND=scikit-build-core "
                f"would build again: set one of them")
        wanted = "setuptools"
    if wanted != "setuptools":
        try:
            import scikit_build_core.build as backend
            return backend
        except ImportError:
            if wanted:
                raise
    try:
        import setuptools.build_meta as backend
    except ImportError as e:
        raise RuntimeError(
            "shmtensor builds with scikit-build-core or setuptools from the "
            "system, and this interpreter has neither: install them "
            "(./deploy/install-deps.sh) and build with "
            "`pip install --no-build-isolation .`") from e
    return backend


_chosen = _backend()


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    return _chosen.build_wheel(wheel_directory, config_settings,
                               metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _chosen.build_sdist(sdist_directory, config_settings)


def get_requires_for_build_wheel(config_settings=None):
    return _chosen.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _chosen.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory,
                                     config_settings=None):
    return _chosen.prepare_metadata_for_build_wheel(metadata_directory,
                                                    config_settings)
