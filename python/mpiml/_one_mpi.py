"""One MPI library a process. mpi4py built for another MPI than mpiml's
(Debian's python3-mpi4py is built for Open MPI) would start a second MPI
beside mpiml's, which shares nothing with it: a crash, or every rank a job
of its own. Whichever of ``import mpiml`` and ``import mpi4py.MPI`` comes
second raises MPILibraryError (an ImportError) naming both libraries,
before either starts MPI. With mpiml first, the MPI start in mpi4py's
import is watched as mpiml's own."""
import ctypes
import importlib.abc
import importlib.machinery
import os
import sys

from . import _core
from .errors import MPILibraryError


def check(call):
    other = _core._other_mpi_library()
    if other:
        raise MPILibraryError("%s: %s" % (call, other))


class _WatchedStart(importlib.abc.Loader):
    """mpi4py.MPI's loader, with MPI's start (in the module's init) watched
    as mpiml's own: a rank of this host that ended before it started MPI,
    MPIML_TIMEOUT, the stall line (docs/RELIABILITY.md)."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        _core._begin_foreign_init()
        try:
            return self._loader.create_module(spec)
        except BaseException:
            _core._end_foreign_init()
            raise

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        finally:
            _core._end_foreign_init()


class _Mpi4pyGuard(importlib.abc.MetaPathFinder):
    """Loads mpi4py.MPI's shared object (MPI starts only when the module
    runs) and checks the libraries before its import goes on; then its MPI
    start is watched."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "mpi4py.MPI":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.origin and spec.origin.endswith(".so"):
            try:
                ctypes.CDLL(spec.origin, mode=os.RTLD_LOCAL)
            except OSError:
                return spec  # its own import says what is wrong
            check("import mpi4py.MPI")
            spec.loader = _WatchedStart(spec.loader)
        return spec


def guard_mpi4py():
    if not any(isinstance(f, _Mpi4pyGuard) for f in sys.meta_path):
        sys.meta_path.insert(0, _Mpi4pyGuard())
