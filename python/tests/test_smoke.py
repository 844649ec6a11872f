"""The installed package imports and reports MPI's rank and size."""
import os

import mpiml._core as core


def test_rank_and_size_match_the_launcher():
    # mpirun, Hydra, or srun (which sets SLURM_NTASKS and SLURM_PROCID)
    env = os.environ.get
    size = int(env("OMPI_COMM_WORLD_SIZE", env("PMI_SIZE", env("SLURM_NTASKS", "1"))))
    rank = int(env("OMPI_COMM_WORLD_RANK", env("PMI_RANK", env("SLURM_PROCID", "0"))))
    assert core.num_procs() == size
    assert core.proc_id() == rank


def test_imported_from_the_install_tree():
    assert "/install/" in core.__file__, core.__file__
