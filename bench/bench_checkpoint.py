"""mpiml.checkpoint.save_checkpoint against one plain write() + fsync() of the
same bytes, in the same run, interleaved (order rotated each round); medians
over rounds. The state: ResNet-50-sized parameters and Adam's two moments
(25.6M float32 each, 307 MB) as shared state:
  plain   rank 0: open, one write() of the 307 MB, fsync, close
  plain (4 MiB writes)  the same in 4 MiB write()s, as the save writes
  torch   three tensors (torch.save into memory, then the save)
  numpy   three numpy arrays (.npy into memory, then the save)
ratio_to_plain (_4mib): the median over rounds of the variant's time over
the plain (4 MiB) write's in the same round.

  PYTHONPATH=<the installed package> mpirun -np 1 python3 bench/bench_checkpoint.py [--rounds=5]
"""
import argparse
import json
import os
import shutil
import statistics
import time

import numpy as np
import torch

import mpiml
from mpiml import checkpoint as ck


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/mpiml_bench_ckpt_py")
    ap.add_argument("--params", type=int, default=25_600_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    rank = mpiml.proc_id()
    if rank == 0:
        shutil.rmtree(a.dir, ignore_errors=True)
        os.makedirs(a.dir)
    mpiml.barrier()

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(a.params, dtype=np.float32) for _ in range(3)]
    tensors = [torch.from_numpy(x) for x in arrays]
    names = ("params", "exp_avg", "exp_avg_sq")
    whole = b"".join(x.tobytes() for x in arrays)
    step = [0]

    def plain(chunk):
        if rank == 0:
            fd = os.open(os.path.join(a.dir, "plain.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            view = memoryview(whole)
            while view:
                view = view[os.write(fd, view[:chunk]):]
            os.fsync(fd)
            os.close(fd)

    def save(values):
        step[0] += 1
        ck.save_checkpoint(os.path.join(a.dir, "ckpt"), step[0], shared=dict(zip(names, values)),
                           per_rank={"rank": rank}, keep=1)

    variants = [("plain", lambda: plain(len(whole))), ("plain (4 MiB writes)", lambda: plain(4 << 20)),
                ("torch", lambda: save(tensors)), ("numpy", lambda: save(arrays))]
    times = {n: [] for n, _ in variants}
    for r in range(a.rounds + 1):  # round 0: warm-up
        for k in range(len(variants)):
            name, fn = variants[(k + r) % len(variants)]
            ck.wait_for_removals()  # as a run's training between saves would let it
            mpiml.barrier()
            if rank == 0:
                if os.path.exists(os.path.join(a.dir, "plain.bin")):
                    os.remove(os.path.join(a.dir, "plain.bin"))
                os.sync()
            mpiml.barrier()
            t0 = time.perf_counter()
            fn()
            mpiml.barrier()
            if r > 0:
                times[name].append(time.perf_counter() - t0)
    if rank == 0:
        for name, t in times.items():
            # Paired: each round's time over the same round's plain write.
            ratio = statistics.median(x / p for x, p in zip(t, times["plain"]))
            ratio4 = statistics.median(x / p for x, p in zip(t, times["plain (4 MiB writes)"]))
            print(json.dumps({"bench": "checkpoint_py", "variant": name, "ranks": mpiml.num_procs(),
                              "bytes": len(whole), "median_s": round(statistics.median(t), 4),
                              "min_s": round(min(t), 4),
                              "ratio_to_plain": round(ratio, 3), "ratio_to_plain_4mib": round(ratio4, 3),
                              "rounds": a.rounds}))
        ck.wait_for_removals()
        shutil.rmtree(a.dir)


if __name__ == "__main__":
    main()
