"""The seed's mpi_pytorch on mpiml: drop-in for spinup.utils.mpi_pytorch.

    setup_pytorch_for_mpi()
    sync_params(module)
    ...
    loss.backward()
    mpi_avg_grads(module)   # one fused C++ call: buckets, one allreduce each
    optimizer.step()

Differences from the seed (tested in python/tests/test_mpi_pytorch.py):
- mpi_avg_grads: one call into mpiml's C++ core per call (gradients packed
  into buckets, or reduced in place; the node shared-memory path when it
  applies), dtype kept, a missing gradient (None) counts as zeros on that
  rank (the seed raises AttributeError on that rank and hangs the others).
- sync_params: parameters AND buffers (e.g. BatchNorm's running stats), bit
  exact, after a cross-rank check that the modules match (a clear error on
  every rank instead of a hang or a silent corruption).
- every call takes an optional comm= (an mpi4py communicator).

Beyond the seed: GradAverager(module, ...) holds one model's plan (and, with
gradient_as_bucket_view=True, keeps its gradients in node-shared buckets);
avg() then averages like mpi_avg_grads, faster on small models.
"""
import torch  # noqa: F401  (before mpiml._torch: its type casters need torch)

from . import _core  # noqa: F401  (exception translation)
from . import _torch
from .mpi_tools import broadcast, mpi_avg, num_procs, proc_id  # noqa: F401  (as the seed)

__all__ = ["setup_pytorch_for_mpi", "mpi_avg_grads", "GradAverager", "sync_params", "mpi_avg",
           "mpi_avg_tensor"]

# mpi_avg_grads for one model with its plan held (C++ mpiml::GradAverager):
#   avg = GradAverager(ac.pi, gradient_as_bucket_view=True)
#   ... loss.backward(); avg(); optimizer.step()
# overlap=True averages buckets while backward() runs (worth it when the
# averaging crosses hosts; on one node it averages in avg() unless
# overlap_on_one_node=True); `with avg.no_sync(): loss.backward()` accumulates.
# Parameters are taken at construction; construction, each call and
# destruction are collective (create and drop it at the same point on every
# rank, or keep it for the whole run).
GradAverager = _torch.GradAverager


def setup_pytorch_for_mpi():
    """Avoid slowdowns caused by each rank's PyTorch using more than its fair
    share of CPU cores: each rank gets max(1, cores / ranks on its node)
    intra-op threads (ranks bound to disjoint cores keep theirs)."""
    _torch.setup_pytorch_for_mpi()


def mpi_avg_grads(module, comm=None, gradient_as_bucket_view=False, bucket_cap_mb=25):
    """Averages the gradients of module's parameters (or of an iterable of
    parameters) across ranks, in place, in one fused C++ call. With
    MPIML_CHECK=1 it first compares the ranks' modules, as sync_params does."""
    _torch.mpi_avg_grads(module, comm, bucket_cap_mb, gradient_as_bucket_view)


def sync_params(module, root=0, comm=None):
    """Makes every rank's parameters and buffers equal to root's. First
    compares the ranks' modules (names, shapes, dtypes): on a difference every
    rank raises ArgumentError naming the first parameter or buffer that
    differs."""
    _torch.sync_params(module, root, comm)


def mpi_avg_tensor(x, comm=None):
    """Average of a tensor over ranks, as a new tensor of the same dtype and
    device (integers: float64). mpi_avg (the seed's) returns numpy."""
    return _torch.mpi_avg(x, comm)
