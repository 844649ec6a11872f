"""Fixtures shared by the torch.distributed tests: the default group on
backend "mpiml" (once per pytest session) and a Gloo group beside it.
Import them into a test module: from c10d_fixtures import world, gloo"""
import datetime

import pytest
import torch.distributed as dist

import mpiml.torch


@pytest.fixture(scope="session", autouse=True)
def world():
    if not dist.is_initialized():
        mpiml.torch.init_process_group(timeout=datetime.timedelta(seconds=60),
                                       abort_on_exception=False)
    return dist.get_rank(), dist.get_world_size()


@pytest.fixture(scope="session")
def gloo(world):
    return dist.new_group(backend="gloo")
