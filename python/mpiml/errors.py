"""mpiml's exceptions. Every message names the call and the rank
("mpi_avg on rank 1/2: ..."); the attributes call, rank (-1 outside MPI)
and mpi_code (0 unless MPI itself failed) say the same."""


class Error(RuntimeError):
    """Base of every mpiml exception."""

    call = ""
    rank = -1
    mpi_code = 0


class ArgumentError(Error, ValueError):
    """A bad argument or a cross-rank mismatch (a ValueError)."""


class DtypeError(Error, TypeError):
    """An element type that the call does not support (a TypeError)."""


class NoSamplesError(ArgumentError):
    """mpi_statistics_scalar: no rank has any sample (raised on every rank)."""


class MPILibraryError(Error, ImportError):
    """Two MPI libraries in one process: mpiml's and another one, such as
    an mpi4py built for another MPI (raised by ``import mpiml`` or
    ``import mpi4py.MPI``, whichever comes second)."""


class MPIError(Error):
    """MPI itself reported an error (mpi_code is MPI's error code)."""


class CheckpointError(Error, OSError):
    """A checkpoint that could not be written or read: a full disk, an
    unwritable directory, a corrupt checkpoint asked for by step. Raised on
    every rank; errno is the system's error code (None when the data was
    corrupt) and path the file or directory concerned."""

    path = ""
