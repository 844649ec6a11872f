"""DistributedDataParallel on the torch.distributed backend "mpiml",
checkpointed every epoch: a restarted job resumes and ends bit for bit where
an uninterrupted job ends.

    mpiml-run --restarts 2 -np 2 python3 examples/ddp_resume.py --out /tmp/ddp
    MPIML_INJECT=kill:1:150 mpiml-run --restarts 1 -np 2 \
        python3 examples/ddp_resume.py --out /tmp/ddp

A small MLP (with dropout: each rank's RNG matters) fitted to a synthetic
regression set, sharded by DistributedSampler. Rank 0 writes DIR/progress.txt
and, at the end, DIR/final.pt (the model's state_dict).
"""
import argparse
import os
import shutil
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import mpiml.torch
from mpiml.checkpoint import capture_rng, load_checkpoint, restore_rng, save_checkpoint
from mpiml.mpi_tools import restart_attempt


def dataset(n=2048, dim=16, seed=1234):
    """The same synthetic set on every rank: y = sin(x @ w) + noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, 1, generator=g)
    return TensorDataset(x, torch.sin(x @ w) + 0.1 * torch.randn(n, 1, generator=g))


def write_progress(out, rows):
    tmp = os.path.join(out, "progress.txt.tmp")
    with open(tmp, "w") as f:
        f.write("epoch\tstep\tloss\n")
        f.writelines("%d\t%d\t%r\n" % row for row in rows)
    os.replace(tmp, os.path.join(out, "progress.txt"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="batch size per rank")
    parser.add_argument("--out", default="ddp_out", help="progress.txt, final.pt and ckpt/ go here")
    parser.add_argument("--resume", action="store_true",
                        help="resume from DIR/ckpt (a restarted job always does)")
    args = parser.parse_args()

    mpiml.torch.init_process_group()
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(rank)  # dropout differs across ranks; DDP broadcasts rank 0's weights
    os.makedirs(args.out, exist_ok=True)

    data = dataset()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    ckpt_dir = os.path.join(args.out, "ckpt")
    start_epoch, step, rows = 0, 0, []
    if args.resume or restart_attempt() > 0:
        ck = load_checkpoint(ckpt_dir)  # the newest one every rank can read; None: none yet
        if ck is not None and ck.world_size != dist.get_world_size():
            if rank == 0:
                print("%s was saved by %d ranks, not %d" % (ck.path, ck.world_size,
                                                              dist.get_world_size()), file=sys.stderr)
            sys.exit(2)  # every rank
        if ck is None and rank == 0:
            print("no checkpoint in %s: starting from epoch 0" % ckpt_dir, flush=True)
        if ck is not None:
            start_epoch, shared, mine = ck
            model.load_state_dict(shared["model"])  # before DDP: it broadcasts rank 0's
            optimizer.load_state_dict(shared["optimizer"])
            step, rows = shared["step"], shared["rows"]
            restore_rng(mine["rng"])
            if rank == 0:
                print("resumed from epoch %d" % start_epoch, flush=True)
                write_progress(args.out, rows)
    else:  # a fresh run: never resume from an older run's checkpoints
        if rank == 0:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        dist.barrier()
    ddp = DDP(model)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # the shuffle depends on the epoch only
        total = torch.zeros(2, dtype=torch.float64)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()  # gradients averaged over ranks by DDP on "mpiml"
            optimizer.step()
            step += 1
            total += torch.tensor([loss.item() * len(x), len(x)], dtype=torch.float64)
        dist.all_reduce(total)
        rows.append((epoch, step, (total[0] / total[1]).item()))
        if rank == 0:
            write_progress(args.out, rows)
            print("epoch %d  step %d  loss %.6f" % rows[-1], flush=True)
        save_checkpoint(ckpt_dir, epoch + 1, keep=2,
                        shared={"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "step": step, "rows": rows},
                        per_rank={"rng": capture_rng()})

    if rank == 0:
        torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
