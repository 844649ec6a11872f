"""torch.distributed with the Gloo backend on the benchmark workloads:
gradient averaging (per-parameter all_reduce, and bucketed: flattened into
buckets of at most 25 MiB like mpiml's default, one all_reduce each) and
parameter sync (per-parameter broadcast, and one flattened broadcast per
bucket).

Rendezvous through the environment: RANK and WORLD_SIZE (or Open MPI's
OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE, so it runs under mpirun),
MASTER_ADDR (default 127.0.0.1) and MASTER_PORT.

  MASTER_PORT=29511 mpirun -np 2 /usr/bin/python3 bench/peers/gloo_peer.py
      [--models=ac64,ac256,resnet50] [--rounds=7] [--round-ms=20]
"""
import os

import torch
import torch.distributed as dist

import common

BUCKET_CAP_BYTES = 25 << 20


class GlooComm:
    def barrier(self):
        dist.barrier()

    def max(self, x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])


def buckets(tensors, cap=BUCKET_CAP_BYTES):
    """Consecutive groups of at most cap bytes (a larger tensor alone)."""
    out, cur, cur_bytes = [], [], 0
    for t in tensors:
        b = t.numel() * t.element_size()
        if cur and cur_bytes + b > cap:
            out.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += b
    if cur:
        out.append(cur)
    return out


def avg_per_param(params, world):
    for p in params:
        dist.all_reduce(p.grad)
        p.grad.div_(world)


def avg_bucketed(grad_buckets, world):
    for group in grad_buckets:
        flat = torch.cat([g.reshape(-1) for g in group])
        dist.all_reduce(flat)
        flat.div_(world)
        offset = 0
        for g in group:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n


def bcast_per_param(params):
    for p in params:
        dist.broadcast(p.data, 0)


def bcast_bucketed(data_buckets):
    for group in data_buckets:
        flat = torch.cat([d.reshape(-1) for d in group])
        dist.broadcast(flat, 0)
        offset = 0
        for d in group:
            n = d.numel()
            d.copy_(flat[offset:offset + n].view_as(d))
            offset += n


def main():
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # The same fair share of intra-op threads as the seed's setup_pytorch_for_mpi.
    if torch.get_num_threads() > 1:
        torch.set_num_threads(max(int(torch.get_num_threads() / world), 1))
    comm = GlooComm()
    rounds = int(common.arg("rounds", "7"))
    round_s = float(common.arg("round-ms", "20")) * 1e-3
    for name in common.arg("models", "ac64,ac256,resnet50").split(","):
        model = common.make_model(name)
        common.fill(model, rank)
        info = common.model_info(model)
        params = list(model.parameters())
        with torch.no_grad():
            gb = buckets([p.grad for p in params])
            db = buckets([p.data for p in params])
            grads = [common.Variant("gloo_per_param", lambda: avg_per_param(params, world)),
                     common.Variant("gloo_bucketed", lambda: avg_bucketed(gb, world))]
            sync = [common.Variant("gloo_per_param", lambda: bcast_per_param(params), True),
                    common.Variant("gloo_bucketed", lambda: bcast_bucketed(db), True)]
            for bench, variants in (("avg_grads", grads), ("sync_params", sync)):
                for t in common.measure(comm, variants, rounds, round_s):
                    common.emit(rank, "grads", bench, world, t, model=name, **info)
        del model, params, gb, db
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
