"""mpiml: MPI tools for data-parallel machine learning.

    from mpiml.mpi_tools import mpi_fork, mpi_avg, proc_id, mpi_statistics_scalar, num_procs
    from mpiml.mpi_pytorch import setup_pytorch_for_mpi, sync_params, mpi_avg_grads
    from mpiml.checkpoint import save_checkpoint, load_checkpoint, capture_rng, restore_rng

`mpiml` itself exposes both modules' functions. Importing mpiml does not
import torch (mpiml.mpi_pytorch does) and does not initialize MPI: the first
call that needs MPI does (MPI_THREAD_MULTIPLE), unless mpi4py or another
library initialized it first, in which case that library also finalizes it.
"""
from . import errors
from .errors import ArgumentError, CheckpointError, DtypeError, Error, MPIError, MPILibraryError, NoSamplesError
from . import _one_mpi
_one_mpi.check("import mpiml")  # before anything calls into MPI
_one_mpi.guard_mpi4py()
from . import mpi_tools
from .mpi_tools import (IN_PLACE, allreduce, barrier, broadcast, mpi_avg, mpi_fork, mpi_op,
                        mpi_statistics_scalar, mpi_sum, msg, num_procs, pprint, proc_id)
from . import checkpoint
from .checkpoint import capture_rng, load_checkpoint, restore_rng, save_checkpoint
from .runtime import (EXIT_STOPPED, check_enabled, profile_dir, profile_start, profile_stop, profiling,
                      region, report, set_check, set_timeout, should_stop, stop_on_signals,
                      stop_requested, stop_signal, timeout)

_TORCH_NAMES = ("setup_pytorch_for_mpi", "sync_params", "mpi_avg_grads", "GradAverager")


def __getattr__(name):
    # mpiml.mpi_pytorch and its functions, imported (with torch) on first use.
    if name == "mpi_pytorch" or name in _TORCH_NAMES:
        import importlib
        mod = importlib.import_module(".mpi_pytorch", __name__)
        return mod if name == "mpi_pytorch" else getattr(mod, name)
    raise AttributeError("module 'mpiml' has no attribute %r" % name)
