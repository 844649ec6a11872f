"""The installed package imports and reports MPI's rank and size."""
import os

import mpiml._core as core


def test_rank_and_size_match_the_launcher():
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    assert core.num_procs() == size
    assert core.proc_id() == rank


def test_imported_from_the_install_tree():
    assert "/install/" in core.__file__, core.__file__
