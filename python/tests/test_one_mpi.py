"""Two MPI libraries in one process: mpiml's and another one (Debian's
mpi4py is built for Open MPI; mpiml may be built for MPICH). Whichever is
imported second raises MPILibraryError, an ImportError naming both, before
MPI starts in it; jobs of 2 ranks launched from the test (run at one rank)."""
import importlib.util
import pathlib
import subprocess

import pytest

from test_jobs import PY, mpirun, run, write  # noqa: E402 (the jobs' launcher and helpers)


def _other_mpi():
    """The soname of the MPI library that mpiml is not built for."""
    from mpiml import _core  # noqa: F401 - maps mpiml's MPI library
    with open("/proc/self/maps") as f:
        return "libmpi.so.40" if "libmpich" in f.read() else "libmpich.so.12"


ONE_MPI = """
    import ctypes, importlib, importlib.util, os, sys
    def load_other():  # as an mpi4py built for the other MPI would
        try:
            ctypes.CDLL("{other}", mode=os.RTLD_LOCAL)
        except OSError:
            print("not installed")
            sys.exit(0)
    def second(name):  # the module, or None when its import was refused
        try:
            return importlib.import_module(name)
        except ImportError as e:
            print("refused: %s: %s" % (type(e).__name__, e))
    order = "{order}"
    if order != "mpiml second" and importlib.util.find_spec("mpi4py") is None:
        print("no mpi4py")
        sys.exit(0)
    if order == "mpi4py first":  # the seed's scripts import mpi4py first
        from mpi4py import MPI
        mpiml = second("mpiml")
        if mpiml:
            assert mpiml.proc_id() == MPI.COMM_WORLD.Get_rank() and mpiml.num_procs() == MPI.COMM_WORLD.Get_size()
            print("imported: one MPI")
    elif order == "mpiml second":
        load_other()
        if second("mpiml"):
            print("imported")
    else:
        import mpiml
        rank = mpiml.proc_id()
        load_other()
        if second("mpi4py.MPI"):
            print("imported")
        assert mpiml.mpi_sum(1) == mpiml.num_procs()  # mpiml's MPI goes on
        print("rank %d goes on" % rank)
    """


def _mpi4py_links(soname):
    """Whether mpi4py.MPI is installed and built for the MPI library soname."""
    spec = importlib.util.find_spec("mpi4py")
    if spec is None:
        return None
    mod = next(pathlib.Path(spec.origin).parent.glob("MPI.*.so"), None)
    return mod is not None and soname in subprocess.run(["ldd", str(mod)], capture_output=True, text=True).stdout


@pytest.mark.parametrize("order", ["mpiml second", "mpi4py second", "mpi4py first"])
def test_a_second_mpi_library_in_the_process_is_refused(tmp_path, order):
    other = _other_mpi()
    script = write(tmp_path, "one_mpi.py", ONE_MPI.format(other=other, order=order))
    p, _ = run(mpirun(2, PY, script), timeout=60)
    out = p.stdout + p.stderr
    if "not installed" in out:
        pytest.skip(other + " is not installed")
    if "no mpi4py" in out:
        pytest.skip("mpi4py is not installed")
    assert p.returncode == 0, out
    if order == "mpi4py first" and not _mpi4py_links(other):
        assert out.count("imported: one MPI") == 2, out  # mpi4py built for mpiml's MPI: they share it
        return
    call = "import mpi4py.MPI" if order == "mpi4py second" else "import mpiml"
    assert out.count("refused: MPILibraryError: %s: this process has two MPI libraries, mpiml's " % call) == 2, out
    assert other in out and "imported" not in out, out
    if order == "mpi4py second":
        assert "rank 0 goes on" in out and "rank 1 goes on" in out, out
