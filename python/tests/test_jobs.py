"""Whole MPI jobs launched from the test (run by ctest at one rank): an
uncaught exception on one rank ends the job, Ctrl-C on the launcher ends
every rank, both import orders with mpi4py, mpi_fork end to end."""
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

PY = sys.executable
# The build's launcher (ctest sets it; Open MPI's mpirun may come first on PATH in an MPICH build).
MPIRUN = os.environ.get("MPIML_TEST_MPIEXEC") or shutil.which("mpirun") or shutil.which("mpiexec")


def clean_env(drop=("MPIML_TIMEOUT",), **extra):
    """This process's environment without the MPI runtime's variables (the
    test itself runs under mpirun) and without the variables in drop (by
    default MPIML_TIMEOUT: the hooks, not the watchdog, must end the jobs)."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("OMPI_", "PMIX_", "PMI_", "OPAL_", "ORTE_", "HYDI_", "IN_MPI"))
                   and not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")) and k not in drop}
    env.update(extra)
    return env


@functools.lru_cache(maxsize=None)
def mpi4py_unusable():
    """Why mpi4py cannot run beside mpiml here (not installed, or built for
    another MPI library, as Debian's is for Open MPI), or None."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed"
    # mpiml's import guard checks mpi4py.MPI's library before MPI starts
    p = subprocess.run([PY, "-c", "import importlib.util, mpiml; importlib.util.find_spec('mpi4py.MPI')"],
                       capture_output=True, text=True, timeout=60, env=clean_env())
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1][:400]


def skip_without_mpi4py():
    why = mpi4py_unusable()
    if why:
        pytest.skip(why)


def mpirun(n, *args):
    cmd = [MPIRUN, "-np", str(n)]
    out = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in out or "OpenRTE" in out:
        cmd += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return cmd + list(args)


def write(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return str(p)


def run(cmd, timeout, env=None, **kw):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=clean_env() if env is None else env, **kw)
    return p, time.monotonic() - t0


def run_failing(cmd, within, timeout=60, env=None):
    """Runs a job that must fail: it ends non-zero in less than `within`
    seconds (a hang runs into `timeout`). Returns its stdout and stderr."""
    p, secs = run(cmd, timeout, env)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert secs < within, (secs, out)
    return out


RAISE = """
    import threading, time
    import numpy as np
    import mpiml.mpi_tools as mt
    if mt.proc_id() == 1:
        time.sleep(0.5)
        def bad():
            raise ValueError("boom on purpose")
        if "{where}" == "thread":
            t = threading.Thread(target=bad)
            t.start()
            t.join()
            time.sleep(30)
        bad()
    mt.mpi_sum(np.ones(3))  # rank 0 waits here for rank 1 forever
    """


@pytest.mark.parametrize("where", ["main", "thread"])
def test_exception_on_one_rank_ends_the_job(tmp_path, where):
    script = write(tmp_path, "raise.py", RAISE.format(where=where))
    out = run_failing(mpirun(2, PY, script), 30)  # without the hooks: a hang until timeout=60
    assert "[mpiml] rank 1/2: ValueError: boom on purpose - aborting the job" in out, out
    assert "Traceback" in out


def test_ctrl_c_on_the_launcher_ends_every_rank(tmp_path):
    script = write(tmp_path, "loop.py", """
        import sys, numpy as np
        import mpiml.mpi_tools as mt
        sys.stdout.write("ready\\n")  # one write: print's pieces interleave across ranks
        sys.stdout.flush()
        while True:
            mt.mpi_sum(np.ones(3))
        """)
    p = subprocess.Popen(mpirun(2, PY, script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=clean_env(), start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)  # as the terminal does
        out, err = p.communicate(timeout=30)  # a job left running is a hang
        assert p.returncode != 0, out + err
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


ORDER = """
    import sys
    {first}
    {second}
    import numpy as np
    assert MPI.Is_initialized() and not MPI.Is_finalized()
    assert mpiml._core.is_initialized()
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE, MPI.Query_thread()
    assert mt.num_procs() == MPI.COMM_WORLD.Get_size() == 2
    assert mt.mpi_sum(np.ones(2), comm=MPI.COMM_WORLD).tolist() == [2.0, 2.0]
    assert MPI.COMM_WORLD.allreduce(1) == 2
    print("ok", mt.proc_id(), flush=True)
    """


@pytest.mark.parametrize("mpi4py_first", [True, False])
def test_import_orders_with_mpi4py(tmp_path, mpi4py_first):
    skip_without_mpi4py()
    a = "from mpi4py import MPI"
    b = "import mpiml, mpiml.mpi_tools as mt; mt.proc_id()"
    first, second = (a, b) if mpi4py_first else (b, a)
    script = write(tmp_path, "order.py", ORDER.format(first=first, second=second))
    p, _ = run(mpirun(2, PY, script), timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert p.stdout.count("ok") == 2, out  # lines of the two ranks may interleave
    # Open MPI itself may print PMIx noise under load; mpiml and Python must not.
    assert "[mpiml]" not in p.stderr and "Traceback" not in p.stderr, out


FORK = """
    import json, os, sys
    import mpiml.mpi_tools as mt
    mt.mpi_fork(2)
    out = os.environ["FORK_OUT"]
    with open(os.path.join(out, "rank%d.json" % mt.proc_id()), "w") as f:
        json.dump({{"argv": sys.argv, "orig": sys.orig_argv, "size": mt.num_procs(),
                   "in_mpi": os.environ.get("IN_MPI"), "omp": os.environ.get("OMP_NUM_THREADS")}}, f)
    sys.exit(int(sys.argv[1]))
    """

ARGS = ["a b", "q\"uo'te", "ünïcødé ☃", "", "--flag=1 2", "$HOME", "*"]


@pytest.mark.parametrize("code", [0, 3])
def test_mpi_fork_script_by_path(tmp_path, code):
    d = tmp_path / "dir with space"
    d.mkdir()
    script = write(d, "fork me.py", FORK.format())
    env = clean_env(FORK_OUT=str(tmp_path))
    cmd = [PY, script, str(code)] + ARGS
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == code, p.stdout + p.stderr  # the seed always exits 0
    for r in range(2):
        with open(tmp_path / ("rank%d.json" % r)) as f:
            got = json.load(f)
        assert got["argv"] == [script, str(code)] + ARGS
        assert got["orig"][1:] == cmd[1:]
        assert got["size"] == 2 and got["in_mpi"] == "1" and got["omp"] == "1"


def test_mpi_fork_python_dash_m(tmp_path):
    pkg = tmp_path / "forkpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg, "__main__.py", FORK.format())
    env = clean_env(FORK_OUT=str(tmp_path))
    cmd = [PY, "-m", "forkpkg", "5", "x y"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert p.returncode == 5, p.stdout + p.stderr
    for r in range(2):
        with open(tmp_path / ("rank%d.json" % r)) as f:
            got = json.load(f)
        assert got["orig"][1:] == cmd[1:] and got["argv"][1:] == ["5", "x y"]
        assert got["size"] == 2


@pytest.mark.parametrize("mpi4py_first", [True, False])
def test_mpi_fork_after_mpi4py_started_mpi(tmp_path, mpi4py_first):
    # mpi4py's import starts MPI as a singleton, which sets the variables a
    # launcher sets; mpi_fork must still start the ranks. An Open MPI setting
    # the program put in os.environ before the import reaches the ranks.
    skip_without_mpi4py()
    order = ["from mpi4py import MPI", "import mpiml.mpi_tools as mt"]
    if not mpi4py_first:
        order.reverse()
    script = write(tmp_path, "fork4py.py", """
        import os, sys
        if "IN_MPI" not in os.environ:  # the program as started, not its ranks
            os.environ["OMPI_MCA_mpi_show_handle_leaks"] = "0"
        {}
        {}
        mt.mpi_fork(2)
        # one write: print's pieces interleave across ranks
        sys.stdout.write("rank %d of %d %d %s\\n" % (mt.proc_id(), mt.num_procs(),
                         MPI.COMM_WORLD.Get_size(), os.environ.get("OMPI_MCA_mpi_show_handle_leaks")))
        sys.stdout.flush()
        """.format(*order))
    p = subprocess.run([PY, script], capture_output=True, text=True, timeout=60, env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(p.stdout.splitlines()) == ["rank 0 of 2 2 0", "rank 1 of 2 2 0"], p.stdout + p.stderr


def test_mpi_fork_is_a_no_op_for_one_rank_and_in_mpi(tmp_path):
    script = write(tmp_path, "noop.py", """
        import sys, mpiml.mpi_tools as mt
        mt.mpi_fork(1)
        mt.mpi_fork(0)
        print("single", mt.num_procs())
        """)
    p = subprocess.run([PY, script], capture_output=True, text=True, timeout=60, env=clean_env())
    assert p.returncode == 0 and p.stdout.split() == ["single", "1"], p.stdout + p.stderr


def test_mpi_fork_in_a_task_of_a_plain_srun_step_refuses(tmp_path):
    # srun -n 4 without MPI support: SLURM_STEP_ID set, no PMI variables; each
    # task would start 4 ranks of its own
    script = write(tmp_path, "bare.py", """
        import mpiml.mpi_tools as mt
        mt.mpi_fork(4)
        print("forked")
        """)
    env = clean_env(SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="4", SLURM_PROCID="2")
    p = subprocess.run([PY, script], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode != 0 and "forked" not in p.stdout, p.stdout + p.stderr
    assert "mpi_fork on rank ?: task 2 of 4 of an srun step without MPI support" in p.stderr, p.stderr
    assert "use srun --mpi=pmix (Open MPI) or --mpi=pmi2 (MPICH)" in p.stderr, p.stderr


@pytest.mark.parametrize("chosen, want", [
    ({}, ["PLUGIN", "--kill-on-bad-exit=1"]),
    ({"SLURM_MPI_TYPE": "pmix_v4"}, ["--kill-on-bad-exit=1"]),
    ({"MPIML_MPIRUN_FLAGS": "--mpi=none"}, ["--kill-on-bad-exit=1", "--mpi=none"]),
])
def test_mpi_fork_with_srun_picks_the_mpi_plugin(tmp_path, chosen, want):
    # MPIML_MPIRUN=srun in a batch script: a stand-in srun that answers
    # --version as Slurm's does; the plan is srun -n 4 with the linked MPI's
    # plugin (Open MPI: pmix, MPICH: pmi2) unless the user chose one
    plugin = "--mpi=pmix" if "--oversubscribe" in mpirun(1) else "--mpi=pmi2"
    want = [plugin if w == "PLUGIN" else w for w in want]
    srun = tmp_path / "srun"
    srun.write_text('#!/bin/sh\necho "slurm 22.05.8"\n')
    srun.chmod(0o755)
    script = write(tmp_path, "plan.py", """
        import json, os, mpiml._core as c
        argv, env = c.plan_fork(4, False)
        print(json.dumps([os.fsdecode(a) for a in argv]))
        """)
    env = clean_env(MPIML_MPIRUN=str(srun), SLURM_JOB_ID="7", **chosen)
    p = subprocess.run([PY, script], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    argv = json.loads(p.stdout)
    assert argv[:3] == [str(srun), "-n", "4"] and argv[3:3 + len(want)] == want, argv
    assert argv[3 + len(want)] in (PY, os.path.realpath(PY)), argv


@pytest.mark.parametrize("n", [1, 2, 3])
def test_grad_averagers_alive_at_exit(tmp_path, n):
    """GradAverager objects (collective to destroy, shared-memory buckets)
    and the free function's cached plans still alive when Python exits: the
    job ends cleanly, every rank's line printed, no error on stderr."""
    script = write(tmp_path, "exit.py", """
        import sys
        import torch
        from torch import nn
        from mpiml.mpi_pytorch import GradAverager, mpi_avg_grads, num_procs, proc_id
        m = nn.Sequential(nn.Linear(17, 64), nn.Tanh(), nn.Linear(64, 6))
        for p in m.parameters():
            p.grad = torch.full_like(p, float(proc_id()))
        views = GradAverager(m, gradient_as_bucket_view=True)
        views()
        packed = GradAverager(m)
        packed()
        mpi_avg_grads(m, gradient_as_bucket_view=True)
        mean = (num_procs() - 1) / 2
        assert all(bool((p.grad == mean).all()) for p in m.parameters())
        sys.stdout.write("done %d\\n" % proc_id())  # one write: ranks' lines never interleave
        sys.stdout.flush()
        """)
    p, took = run(mpirun(n, PY, script), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = sorted(line for line in p.stdout.splitlines() if line)
    assert lines == ["done %d" % r for r in range(n)], p.stdout
    # (Open MPI's own runtime may print under load; mpiml's lines and
    # Python's tracebacks may not appear)
    assert "[mpiml]" not in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_environment_options_from_python(tmp_path):
    """MPIML_PROFILE writes the profile of a Python job; MPIML_TIMEOUT ends a
    job whose rank 0 waits in a collective for a rank that never comes."""
    script = write(tmp_path, "env.py", """
        import sys, time
        import numpy as np
        import mpiml, mpiml.mpi_tools as mt
        with mpiml.region("python_region"):
            mt.mpi_sum(np.ones(4))
        if sys.argv[1] == "hang" and mt.proc_id() == 1:
            time.sleep(60)
        mt.mpi_sum(np.ones(4))
        """)
    prof = tmp_path / "prof"
    env = clean_env(MPIML_PROFILE=str(prof))
    p = subprocess.run(mpirun(2, PY, script, "ok"), capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "python_region" in (prof / "profile_1.json").read_text()
    assert (prof / "timeline.json").exists()
    env = clean_env(MPIML_TIMEOUT="2")
    t0 = time.monotonic()
    p = subprocess.run(mpirun(2, PY, script, "hang"), capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode != 0 and time.monotonic() - t0 < 30
    assert "[mpiml] rank 0/2" in p.stdout + p.stderr, p.stdout + p.stderr


def test_profile_of_a_torch_distributed_job_names_its_calls(tmp_path):
    """The profile of an "mpiml" process group names each collective by its
    call (the names must outlive the calls that made them)."""
    if importlib.util.find_spec("mpiml._c10d") is None:
        pytest.skip("mpiml was built without the torch.distributed backend")
    script = write(tmp_path, "c10d_prof.py", """
        import datetime, torch, torch.distributed as dist
        import mpiml.torch
        mpiml.torch.init_process_group(timeout=datetime.timedelta(seconds=60))
        t = torch.ones(1000)
        for _ in range(3):
            dist.all_reduce(t)
            dist.reduce(t, dst=0)
            dist.broadcast(t, src=0)
        dist.destroy_process_group()
        """)
    prof = tmp_path / "prof"
    env = clean_env(MPIML_PROFILE=str(prof))
    p = subprocess.run(mpirun(2, PY, script), capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    events = json.loads((prof / "profile_0.json").read_text())["traceEvents"]
    calls = [e["args"]["call"] for e in events if e.get("cat") == "mpi" and "call" in e.get("args", {})]
    assert calls.count("mpiml c10d all_reduce") == 3, calls
    assert calls.count("mpiml c10d reduce") == 3, calls
    assert calls.count("mpiml c10d broadcast") == 3, calls


END = """
    import sys, time
    import numpy as np
    import mpiml.mpi_tools as mt

    def main():
        r, n = mt.proc_id(), mt.num_procs()
        mt.mpi_sum(np.ones(3))
        if r == {faulty}:
            if "{how}" == "exit":
                sys.exit(3)
            if "{how}" == "caught":
                try:
                    raise ValueError("handled by exiting")
                except ValueError:
                    sys.exit(4)
            return  # "end": the script ends, status 0
        mt.mpi_sum(np.ones(3))  # waits for the rank that ended

    main()
    """


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("how,status", [("exit", 3), ("end", 0), ("caught", 4)])
def test_a_rank_that_ends_while_others_wait_ends_the_job(tmp_path, n, how, status):
    faulty = n - 1 if how != "end" else 0
    script = write(tmp_path, "end.py", END.format(faulty=faulty, how=how))
    out = run_failing(mpirun(n, PY, script), 20)  # without the exit guard: a hang until timeout=60
    line = "[mpiml] rank %d/%d: exited with status %d (host " % (faulty, n, status)
    assert line in out, out
    assert re.search(r"while (rank \d+ waits|ranks [\d, ]+ wait) in allreduce #2 - aborting the job",
                     out), out


BEFORE = """
    import os, sys, time
    if {mpi4py_first}:
        from mpi4py import MPI
    import numpy as np
    import mpiml.mpi_tools as mt

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    if {touched}:
        mt.proc_id()  # mpiml started (no collective yet)
    if rank == {faulty}:
        sys.exit({status})
    if {late}:
        time.sleep(5)  # the others come to their first collective after it ended
    mt.mpi_sum(np.ones(3))  # waits for the rank that ended
    """


@pytest.mark.parametrize("n", [2, 3])
# Not run: mpi4py first and late (the ended rank is in MPI_Finalize when the
# others come): Open MPI 4.1's mpirun can crash or hang ending that job.
@pytest.mark.parametrize("mpi4py_first,touched,late", [
    (False, True, False), (False, True, True),
    (True, True, False), (True, False, False)])
def test_a_rank_that_ends_before_the_first_collective_ends_the_job(tmp_path, n, mpi4py_first, touched,
                                                                    late):
    """The others wait in their first collective, where mpiml sets itself up
    (with mpi4py first) or right after MPI_Init: the job ends, naming the rank
    that ended, whether or not it made an mpiml call."""
    if mpi4py_first:
        skip_without_mpi4py()
    faulty, status = n - 1, 3 if n == 2 else 0
    script = write(tmp_path, "before.py", BEFORE.format(mpi4py_first=mpi4py_first, touched=touched,
                                                       faulty=faulty, status=status, late=late))
    out = run_failing(mpirun(n, PY, script), 25)  # a hang until timeout=60 before
    ended = "finalized MPI" if mpi4py_first else "exited with status %d" % status
    assert "[mpiml] rank %d/%d: %s (host " % (faulty, n, ended) in out, out
    assert re.search(r"while (rank \d+ waits|ranks [\d, ]+ wait) in allreduce #1 - aborting the job",
                     out), out


BEFORE_INIT = """
    import os, sys, time
    import numpy as np
    import mpiml.mpi_tools as mt
    if (os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["PMI_RANK"]) == "1":
        {late}  # before MPI started
    time.sleep(3)
    {start}  # starts MPI: MPI_Init waits for rank 1
    mt.mpi_sum(np.ones(3))
    """
STARTS = {"mpiml": "pass", "mpi4py": "from mpi4py import MPI"}


def test_a_rank_that_ends_before_mpi_starts_ends_the_job(tmp_path):
    """MPI_Init itself waits for every rank, and the launchers do not end a
    job whose rank ended with status 0: the rank starts MPI on its way out
    and ends the job, naming itself, without a timeout."""
    script = write(tmp_path, "before_init.py", BEFORE_INIT.format(late="sys.exit(0)", start="pass"))
    out = run_failing(mpirun(2, PY, script), 15)
    assert re.search(r"\[mpiml\] rank 1/2: exited with status 0 \(host [^)]+\) before it started MPI, while "
                     r"rank 0 starts MPI - aborting the job", out), out


@pytest.mark.parametrize("start", ["mpiml", "mpi4py"])
def test_a_rank_that_ends_before_mpi_starts_without_exit_handlers_ends_the_job(tmp_path, start):
    """os._exit runs no exit handler: the rank of the same host that waits
    sees it gone and ends the job, naming it, without a timeout; also where
    mpi4py's import (after mpiml's) starts MPI."""
    if start == "mpi4py":
        skip_without_mpi4py()
    script = write(tmp_path, "before_init.py", BEFORE_INIT.format(late="os._exit(0)", start=STARTS[start]))
    out = run_failing(mpirun(2, PY, script), 15)
    assert re.search(r"\[mpiml\] rank \?: (rank 1 \(pid \d+\)|local rank 1 of 2) on this host ended before "
                     r"it started MPI, and MPI_Init_thread \(rank 0 of the launcher\) would wait for it "
                     r"forever - aborting the job", out), out


NONE_STARTED = """
    import sys
    import mpiml.mpi_tools as mt
    sys.exit(0)  # no rank starts MPI
    """


def test_ranks_that_all_end_before_mpi_starts_end_as_usual(tmp_path):
    """Every rank ends before it started MPI: each starts it on its way out,
    finds the others ending too, and the job ends with status 0, silent."""
    script = write(tmp_path, "none_started.py", NONE_STARTED)
    p = subprocess.run(mpirun(3, PY, script), capture_output=True, text=True, timeout=60, env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[mpiml]" not in p.stdout + p.stderr, p.stdout + p.stderr


NESTED = """
    import os, subprocess, sys
    import mpiml  # marks this rank's process; the job below inherits the mark
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HYDI_"))
           or k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    sys.exit(subprocess.run(sys.argv[1:], env=env).returncode)
    """


def test_a_job_launched_from_a_rank_has_ranks_of_its_own(tmp_path):
    """A job launched from a rank's process (a subprocess, not mpi_fork)
    inherits its mark; its ranks are ranks all the same (under Hydra their
    PMI_RANK and PMI_FD may equal the launching rank's): every rank ending
    before MPI still ends the job at once with status 0, silent."""
    inner = write(tmp_path, "none_started.py", NONE_STARTED)
    outer = write(tmp_path, "nested.py", NESTED)
    p, secs = run(mpirun(1, PY, outer, *mpirun(3, PY, inner)), timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[mpiml]" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert secs < 30, secs  # a rank taken for a rank's child: the others wait 60 s for it


CHILDREN = """
    import multiprocessing, os, subprocess, sys, time
    import numpy as np
    import mpiml.mpi_tools as mt

    def work():
        pass  # a spawned child imports this script, so mpiml, and ends

    if __name__ == "__main__":
        t0 = time.monotonic()
        p = multiprocessing.get_context("spawn").Process(target=work)
        p.start()
        p.join()
        q = subprocess.run([sys.executable, "-c", "import mpiml"], env=dict(os.environ))
        took = time.monotonic() - t0
        assert p.exitcode == 0 and q.returncode == 0, (p.exitcode, q.returncode)
        assert took < 10, took  # a child does not start MPI as the rank on its way out
        total = int(mt.mpi_sum(np.ones(1))[0])
        if mt.proc_id() == 0:
            print("total", total)
    """


def test_a_ranks_children_that_end_are_not_ranks_that_end_before_mpi(tmp_path):
    """Processes a rank starts (multiprocessing's spawn, a subprocess with a
    copy of os.environ) inherit the launcher's variables; ending before MPI
    started, they are not taken for the rank: they end at once, and the job
    completes."""
    script = write(tmp_path, "children.py", CHILDREN)
    p = subprocess.run(mpirun(2, PY, script), capture_output=True, text=True, timeout=120,
                       env=clean_env(MPIML_STALL_WARNING="30"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "total 2" in p.stdout, p.stdout + p.stderr
    assert "[mpiml]" not in p.stderr, p.stderr


ORPHAN = """
    import os, numpy as np
    import mpiml.mpi_tools as mt
    mt.mpi_sum(np.ones(3))
    with open(os.path.join({dir!r}, "pid.%d" % mt.proc_id()), "w") as f:
        f.write(str(os.getpid()))
    while True:
        mt.mpi_sum(np.ones(3))
    """


def _ended(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def test_a_rank_whose_launcher_is_killed_ends_itself(tmp_path):
    """The launcher's process of the host (mpirun, hydra_pmi_proxy) killed
    while the ranks run: nothing would end them (Hydra's mpiexec waits for
    them too); each ends at once, the ones the watch ends with a line in the
    abort record."""
    script = write(tmp_path, "orphan.py", ORPHAN.format(dir=str(tmp_path)))
    record = tmp_path / "record"
    p = subprocess.Popen(mpirun(2, PY, script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=clean_env(MPIML_ABORT_RECORD=str(record)), start_new_session=True)
    pids = []
    try:
        _wait_until(_rank_files(tmp_path, "pid"), p)
        time.sleep(0.2)  # the files are written
        pids = [int((tmp_path / ("pid.%d" % r)).read_text()) for r in range(2)]
        with open("/proc/%d/stat" % pids[0]) as f:
            daemon = int(f.read().rsplit(")", 1)[1].split()[1])
        with open("/proc/%d/comm" % daemon) as f:
            name = f.read().strip()
        os.kill(daemon, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 and not (all(_ended(x) for x in pids) and p.poll() is not None):
            time.sleep(0.05)
        assert all(_ended(x) for x in pids), "ranks left after 5 s: %s" % pids
        p.communicate(timeout=5)  # the launcher's command ended too
        # a rank may also end first by its peer's end, then without a line
        lines = record.read_text()
        assert re.search(r"^rank [01]/2 host [^:]+: the launcher's process on this host \(%s, pid %d\) has "
                         r"ended, and nothing else would end this rank$" % (re.escape(name), daemon),
                         lines, re.M), lines
    finally:
        for x in pids:
            if not _ended(x):
                os.kill(x, signal.SIGKILL)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.parametrize("start", ["mpiml", "mpi4py"])
def test_a_rank_that_starts_mpi_late_is_a_timeout_in_mpi_init(tmp_path, start):
    """With MPIML_TIMEOUT the watchdog ends the wait in MPI_Init for a rank
    that has not started MPI (after at least 10 s), naming the rank that
    waits; also in mpi4py's import after mpiml's."""
    if start == "mpi4py":
        skip_without_mpi4py()
    script = write(tmp_path, "before_init.py", BEFORE_INIT.format(late="time.sleep(60)", start=STARTS[start]))
    out = run_failing(mpirun(2, PY, script), 25, env=clean_env(MPIML_TIMEOUT="4"))
    assert re.search(r"watchdog: MPI_Init_thread waited [\d.]+ s, past the timeout of 10 s \(rank 0 of "
                     r"the launcher\); a rank may have ended before it started MPI", out), out


RAISE_BEFORE_INIT = """
    import os, time
    import numpy as np
    import mpiml.mpi_tools as mt
    if (os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["PMI_RANK"]) == "1":
        raise ValueError("bad configuration on rank 1")  # before MPI started
    time.sleep(3)
    mt.mpi_sum(np.ones(3))
    """


def test_a_rank_that_fails_before_mpi_starts_says_so(tmp_path):
    """An exception before mpiml started MPI: the rank's line names it and
    its status, and Open MPI's mpirun ends the job."""
    script = write(tmp_path, "raise_before_init.py", RAISE_BEFORE_INIT)
    out = run_failing(mpirun(2, PY, script), 30)
    assert "ValueError: bad configuration on rank 1" in out, out
    assert re.search(r"\[mpiml\] rank 1 \(pid \d+\): exited with status 1 before it started MPI", out), out


def test_a_rank_that_starts_mpi_late_is_a_stall_line_without_a_timeout(tmp_path):
    """Without MPIML_TIMEOUT nothing ends a wait in MPI_Init for a rank that
    lives on; past MPIML_STALL_WARNING the waiting rank says so once, and the
    job goes on (ended here by the test)."""
    script = write(tmp_path, "before_init.py", BEFORE_INIT.format(late="time.sleep(60)", start="pass"))
    p = subprocess.Popen(mpirun(2, PY, script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=clean_env(MPIML_STALL_WARNING="2"), start_new_session=True)
    try:
        lines = []
        def read():
            for x in p.stderr:
                lines.append(x)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        t0 = time.monotonic()
        while not any("stall" in x for x in lines):
            assert p.poll() is None and time.monotonic() - t0 < 40, "".join(lines)
            time.sleep(0.1)
        line = next(x for x in lines if "stall" in x)
        assert re.search(r"^\[mpiml\] stall: MPI_Init_thread has waited 2\.0 s \(rank 0 of the launcher\); a "
                         r"rank may have ended before it started MPI - the job goes on", line), line
        time.sleep(1)
        assert p.poll() is None, "the job ended after the stall line"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


NONE_USED = """
    import sys, time
    from mpi4py import MPI
    import mpiml.mpi_tools as mt
    if MPI.COMM_WORLD.Get_rank() == 0:
        mt.proc_id()
        time.sleep({wait})
    """


@pytest.mark.parametrize("wait", [0, 5])
def test_ranks_that_all_end_before_any_collective_end_normally(tmp_path, wait):
    """The door at exit is passed by ranks that all end: no abort, whether
    they end together or one 5 s after the others (then the others' wait at
    the door is bounded)."""
    skip_without_mpi4py()
    script = write(tmp_path, "none_used.py", NONE_USED.format(wait=wait))
    p, secs = run(mpirun(3, PY, script), timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "aborting" not in out, out
    assert secs < wait + 15, (secs, out)


EARLY = """
    import sys, time
    import numpy as np
    import mpiml.mpi_tools as mt
    r = mt.proc_id()
    mt.mpi_sum(np.ones(3))
    if r != 0:
        sys.exit(0)
    time.sleep(1.5)  # rank 0 writes its results long after the others ended
    with open({path!r}, "w") as f:
        f.write("written by rank 0")
    """


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_that_ends_first_while_others_work_on_is_legal(tmp_path, n):
    path = tmp_path / "results.txt"
    script = write(tmp_path, "early.py", EARLY.format(path=str(path)))
    p, secs = run(mpirun(n, PY, script), timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "aborting" not in out, out
    assert path.read_text() == "written by rank 0"


C10D_END = """
    import sys
    import torch
    import torch.distributed as dist
    import mpiml.torch
    mpiml.torch.init_process_group()
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        sys.exit(3)
    dist.all_reduce(t)  # rank 0 waits for rank 1
    """


def test_torch_distributed_rank_that_exits_while_others_wait_ends_the_job(tmp_path):
    if importlib.util.find_spec("mpiml._c10d") is None:
        pytest.skip("mpiml was built without the torch.distributed backend")
    script = write(tmp_path, "c10d_end.py", C10D_END)
    out = run_failing(mpirun(2, PY, script), 45, timeout=90)
    assert re.search(r"\[mpiml\] rank 1/2: exited with status 3 \(host [^)]+\) while rank 0 waits in "
                     r"allreduce #\d+ - aborting the job", out), out


AVERAGER_KEPT_TO_THE_END = """
    import sys
    import torch
    import mpiml
    from mpiml.mpi_pytorch import GradAverager
    rank = mpiml.proc_id()
    model = torch.nn.Linear(4, 2)
    avg = GradAverager(model, overlap=OVERLAP, overlap_on_one_node=OVERLAP, gradient_as_bucket_view=OVERLAP)
    for step in range(3 if rank == 0 else 2):  # rank 1 stops one step early
        model.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        avg()
    if rank == 1:
        sys.exit(3)
    """


@pytest.mark.parametrize("shm", ["1", "0"])
@pytest.mark.parametrize("overlap", [False, True])
def test_rank_that_ends_with_its_grad_averager_alive_ends_the_job(tmp_path, shm, overlap):
    # The interpreter's teardown destroys the averager: its shared buckets are
    # left to MPI_Finalize (after the exit guard), not freed collectively while
    # rank 0 still waits in the averager's allreduce.
    if importlib.util.find_spec("mpiml._torch") is None:
        pytest.skip("mpiml was built without LibTorch")
    script = write(tmp_path, "kept.py", AVERAGER_KEPT_TO_THE_END.replace("OVERLAP", str(overlap)))
    out = run_failing(mpirun(2, PY, script), 45, timeout=90, env=clean_env(MPIML_SHM=shm))
    assert re.search(r"\[mpiml\] rank 1/2: exited with status 3 \(host [^)]+\) while rank 0 waits in "
                     r"allreduce #\d+ - aborting the job", out), out


AVERAGER_DROPPED_ON_ONE_RANK = """
    import gc, sys
    import torch
    import mpiml
    from mpiml.mpi_pytorch import GradAverager
    model = torch.nn.Linear(4, 2)
    avg = GradAverager(model)
    model(torch.randn(3, 4)).sum().backward()
    avg()
    cycle = [avg]
    cycle.append(cycle)  # freed by the garbage collector, when it runs
    del avg, cycle
    if mpiml.proc_id() == 1:
        gc.collect()  # on this rank only: no collective, no wait
    print(f"sum {mpiml.mpi_sum(1.0)}", flush=True)  # one write: the ranks' lines may interleave
    with GradAverager(model) as avg:  # close() at the end: collective, every rank here
        model(torch.randn(3, 4)).sum().backward()
        avg()
    avg = GradAverager(model)
    model(torch.randn(3, 4)).sum().backward()
    avg()  # its buckets are made
    if sys.argv[1] == "close" and mpiml.proc_id() == 1:
        avg.close()  # collective: rank 0 does not close its own
    print(f"sum {mpiml.mpi_sum(1.0)}", flush=True)
    """


@pytest.mark.parametrize("how", ["drop", "close"])
def test_averager_dropped_on_one_rank_runs_no_collective(tmp_path, how):
    # Python drops an averager when its last reference goes, or when the
    # garbage collector finds it in a cycle, at a moment of its own on each
    # rank: that runs no collective (its shared memory is kept to the end).
    # close() frees it now, collectively: on one rank only, a mismatch, not
    # a hang.
    if importlib.util.find_spec("mpiml._torch") is None:
        pytest.skip("mpiml was built without LibTorch")
    script = write(tmp_path, "dropped.py", AVERAGER_DROPPED_ON_ONE_RANK)
    if how == "drop":
        p, _ = run(mpirun(2, PY, script, "drop"), timeout=90)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert p.stdout.count("sum 2.0") == 4, out
        return
    out = run_failing(mpirun(2, PY, script, "close"), 45, timeout=90)
    assert re.search(r"mpi_sum on rank 0/2: mismatched .*rank 1 .*aborting the job", out), out


GROUPS_AT_ONCE = """
    import torch, torch.distributed as dist, mpiml.torch
    mpiml.torch.init_process_group()
    rank = dist.get_rank()
    groups = [dist.new_group() for _ in range(4)]
    ts = [torch.ones(4) for _ in groups]
    order = list(range(len(groups)))
    if rank % 2:
        order.reverse()
    # each group's worker makes its shared-memory context at its first call,
    # the groups in a different order on each rank
    works = [dist.all_reduce(ts[i], group=groups[i], async_op=True) for i in order]
    for w in works:
        w.wait()
    print("done", [t[0].item() for t in ts], flush=True)
    """


def test_torch_distributed_groups_started_at_once_end_cleanly(tmp_path):
    # MPI_Finalize frees every group's shared window, collectively: in one
    # order on every rank whatever order the groups' threads made them in.
    if importlib.util.find_spec("mpiml._c10d") is None:
        pytest.skip("mpiml was built without the torch.distributed backend")
    script = write(tmp_path, "groups.py", GROUPS_AT_ONCE)
    for _ in range(6):
        p, _ = run(mpirun(2, PY, script), timeout=60)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert p.stdout.count("[2.0, 2.0, 2.0, 2.0]") == 2, out  # lines may interleave


RESTART = """
    import numpy as np
    import mpiml.mpi_tools as mt
    mt.mpi_fork(2, restarts=2, backoff=0.2)
    attempt = mt.restart_attempt()
    for _ in range(3):
        mt.mpi_sum(np.ones(2))
    if mt.proc_id() == 0:
        print("attempt=%d" % attempt, flush=True)
    """


@pytest.mark.parametrize("inject,status", [("exit=3:1:2", 3), ("kill:0:2", None)])
def test_mpi_fork_restarts_after_a_failure(tmp_path, inject, status):
    script = write(tmp_path, "restart.py", RESTART)
    t0 = time.monotonic()
    p = subprocess.run([PY, script], capture_output=True, text=True, timeout=120,
                       env=clean_env(MPIML_INJECT=inject))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert time.monotonic() - t0 < 60, out
    assert re.search(r"\[mpiml\] mpi_fork: attempt 1 of 3 failed with status %s \(rank \d/2 host "
                     % (status if status is not None else r"\d+"), out), out
    assert "attempt 2 of 3 failed" not in out, out
    assert "attempt=1" in p.stdout, out


def test_mpi_fork_restarts_argument_checked():
    import mpiml.mpi_tools as mt
    with pytest.raises(ValueError, match="restarts must be >= 0"):
        mt.mpi_fork(2, restarts=-1)


SIGNALED = """
    import os, signal, sys, time
    import numpy as np
    import mpiml.mpi_tools as mt
    mt.mpi_fork(2, restarts={restarts})
    got = []
    signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
    open(os.path.join({dir!r}, "ready.%d" % mt.proc_id()), "w").close()
    while mt.mpi_sum(np.array([1 if got else 0]))[0] < 2:
        time.sleep(0.05)
    sys.stdout.write("rank %d got SIGUSR2\\n" % mt.proc_id())  # one write per line
    sys.stdout.flush()
    """

MPIML_RUN = os.environ.get("MPIML_RUN") or shutil.which("mpiml-run")
MPIML_PPO = os.environ.get("MPIML_PPO") or shutil.which("mpiml-ppo")


def _front(front, tmp_path):
    """The command a user starts: the process signals are sent to."""
    if front == "mpiml-ppo":
        if not MPIML_PPO:
            pytest.skip("mpiml-ppo not built (set MPIML_PPO)")
        return [MPIML_PPO, "--cpu", "2", "--epochs", "1000", "--checkpoint-every", "0",
                "--out", str(tmp_path / "out")]
    script = write(tmp_path, "signaled.py", SIGNALED.format(
        restarts=1 if front == "mpi_fork(restarts=1)" else 0, dir=str(tmp_path)))
    if front == "mpiml-run":
        if not MPIML_RUN:
            pytest.skip("mpiml-run not found (set MPIML_RUN)")
        return [MPIML_RUN, "-np", "2", PY, script]
    return [PY, script]


def _job_left(tmp_path):
    """Processes of the job still running (their command lines name tmp_path)."""
    p = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split() if int(x) != os.getpid()]


def _wait_until(ready, p, limit=60):
    """Waits until ready() (files the job writes once it runs), or fails with
    the job's output when it ends or limit seconds pass first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and p.poll() is None:
        if ready():
            return
        time.sleep(0.05)
    raise AssertionError("the job did not start: %s" % (p.communicate(timeout=30),))


def _rank_files(tmp_path, stem, n=2):
    return lambda: all((tmp_path / ("%s.%d" % (stem, r))).exists() for r in range(n))


def _kill_job(tmp_path, p):
    """Whatever of the job a failed case left running."""
    for pid in _job_left(tmp_path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _wait_ready(tmp_path, p, front):
    if front == "mpiml-ppo":  # its first epoch's row
        _wait_until(lambda: (tmp_path / "out" / "progress.txt").exists(), p)
    else:
        _wait_until(_rank_files(tmp_path, "ready"), p)


@pytest.mark.parametrize("front", ["mpi_fork", "mpi_fork(restarts=1)", "mpiml-run"])
def test_sigusr1_and_sigusr2_to_the_front_process_reach_the_ranks(tmp_path, front):
    """SIGUSR1 sent to the process the user started prints a report and the
    job goes on; SIGUSR2 reaches every rank (as mpirun's own forwarding)."""
    p = subprocess.Popen(_front(front, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=clean_env(), start_new_session=True)
    try:
        _wait_ready(tmp_path, p, front)
        p.send_signal(signal.SIGUSR1)
        time.sleep(3)
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGUSR2)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, out + err
        assert "[mpiml] report: where every rank is (2 ranks)" in err, err
        assert sorted(l for l in out.splitlines() if "got SIGUSR2" in l) == [
            "rank 0 got SIGUSR2", "rank 1 got SIGUSR2"], out + err
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


DETACHED = """#!/bin/sh
# Hydra's launcher for another host: runs the proxy detached (not under
# mpiexec), as on a host of its own; lives as long as the proxy does.
while [ "${1#-}" != "$1" ]; do shift; done
shift  # the host
pidfile=$(mktemp)
(setsid sh -c "$* & echo \\$! > $pidfile; wait" &)
while [ ! -s "$pidfile" ]; do sleep 0.05; done
pid=$(cat "$pidfile"); rm -f "$pidfile"
while kill -0 "$pid" 2> /dev/null; do sleep 0.2; done
"""


def test_sigusr2_to_the_front_process_with_no_rank_on_its_host_under_hydra(tmp_path):
    """Under Hydra, which would end the job on SIGUSR2, the front process
    hands it to the ranks of its host; with none there (a proxy on another
    host) it says so and the job goes on."""
    if "--oversubscribe" in mpirun(1):
        pytest.skip("Hydra only (Open MPI's mpirun passes SIGUSR2 on to every rank)")
    if not MPIML_RUN:
        pytest.skip("mpiml-run not found (set MPIML_RUN)")
    launcher = tmp_path / "detached.sh"
    launcher.write_text(DETACHED)
    launcher.chmod(0o755)
    script = write(tmp_path, "signaled.py", SIGNALED.format(restarts=0, dir=str(tmp_path)))
    env = clean_env(MPIML_MPIRUN_FLAGS="-launcher ssh -launcher-exec %s -hosts elsewhere" % launcher)
    p = subprocess.Popen([MPIML_RUN, "-np", "2", PY, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, start_new_session=True)
    try:
        _wait_ready(tmp_path, p, "mpiml-run")
        p.send_signal(signal.SIGUSR2)
        time.sleep(3)
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert "[mpiml] SIGUSR2: no rank of this job runs on this host, and MPICH's mpiexec would end the job " \
               "on it: not passed on" in err, out + err
        assert "got SIGUSR2" not in out, out + err
    finally:
        _kill_job(tmp_path, p)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
@pytest.mark.parametrize("front", ["mpi_fork", "mpi_fork(restarts=1)", "mpiml-run", "mpiml-ppo"])
def test_sigterm_to_the_front_process_ends_the_whole_job(tmp_path, front, sig):
    """A SIGTERM, SIGHUP or SIGINT sent to the process the user started (a
    batch system's, or kill) ends every rank, with no restart: nothing is left
    running (the ranks and mpirun would go on without it)."""
    p = subprocess.Popen(_front(front, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=clean_env(), start_new_session=True)
    try:
        _wait_ready(tmp_path, p, front)
        t0 = time.monotonic()
        p.send_signal(getattr(signal, sig))
        out, err = p.communicate(timeout=30)
        assert p.returncode != 0, out + err
        left = _job_left(tmp_path)
        while left and time.monotonic() - t0 < 15:
            time.sleep(0.2)
            left = _job_left(tmp_path)
        assert not left, ("processes of the job still running", left, out + err)
        assert "restarting" not in err, err
    finally:
        _kill_job(tmp_path, p)


@pytest.mark.parametrize("env,want", [({}, 0), ({"SLURM_RESTART_COUNT": "2"}, 2),
                                      ({"SLURM_RESTART_COUNT": "1", "MPIML_ATTEMPT": "1"}, 2),
                                      ({"SLURM_RESTART_COUNT": "0"}, 0)])
def test_restart_attempt_counts_slurm_requeues(env, want):
    code = "import mpiml.mpi_tools as mt; print(mt.restart_attempt())"
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                       env=clean_env(**env))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(want), p.stdout + p.stderr


def test_mpiml_ppo_requeued_by_slurm_resumes(tmp_path):
    """A batch job Slurm requeues runs its script again with SLURM_RESTART_COUNT
    set: mpiml-ppo continues from its checkpoints instead of starting afresh
    (and deleting them)."""
    if not MPIML_PPO:
        pytest.skip("mpiml-ppo not built (set MPIML_PPO)")
    cmd = [MPIML_PPO, "--epochs", "2", "--steps", "400", "--out", str(tmp_path / "out")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=clean_env())
    assert first.returncode == 0, first.stdout + first.stderr
    cmd[2] = "3"
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           env=clean_env(SLURM_RESTART_COUNT="1"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "mpiml-ppo: resuming from" in again.stdout, again.stdout
    rows = (tmp_path / "out" / "progress.txt").read_text().splitlines()
    assert [r.split("\t")[0] for r in rows[1:]] == ["0", "1", "2"], rows


def test_mpiml_ppo_total_env_interacts_counts_steps_across_a_resume(tmp_path):
    """TotalEnvInteracts is the steps taken, also when a resumed run changes
    --steps (it went back before: epochs times the new steps)."""
    if not MPIML_PPO:
        pytest.skip("mpiml-ppo not built (set MPIML_PPO)")
    out = str(tmp_path / "out")
    for args in (["--epochs", "2", "--steps", "400"],
                 ["--epochs", "4", "--steps", "600", "--resume", "auto"]):
        p = subprocess.run([MPIML_PPO, "--out", out] + args, capture_output=True, text=True,
                           timeout=120, env=clean_env())
        assert p.returncode == 0, p.stdout + p.stderr
    rows = [r.split("\t") for r in (tmp_path / "out" / "progress.txt").read_text().splitlines()]
    col = rows[0].index("TotalEnvInteracts")
    assert [int(float(r[col])) for r in rows[1:]] == [400, 800, 1400, 2000], rows


def test_job_stopped_just_after_a_wait_began_is_not_a_hang(tmp_path):
    """The job stopped a few ms after rank 1 began to wait in a collective
    (between two of the watchdog's ticks), for twice MPIML_TIMEOUT: the
    stopped time is not waiting there either."""
    script = write(tmp_path, "stopped_early.py", """
        import os, signal, sys, threading, time
        import numpy as np
        import mpiml.mpi_tools as mt
        d = %r
        r = mt.proc_id()
        open(os.path.join(d, "pid.%%d" %% r), "w").write(str(os.getpid()))
        mt.mpi_sum(np.ones(1))  # both files are written
        pids = [int(open(os.path.join(d, "pid.%%d" %% q)).read()) for q in range(2)]
        if r == 1:
            def stop():
                time.sleep(0.005)  # rank 1 waits in the allreduce by now
                for pid in pids:  # rank 0, then this rank
                    os.kill(pid, signal.SIGSTOP)
            threading.Thread(target=stop).start()
        else:
            time.sleep(0.5)  # rank 1 waits for it
        mt.mpi_sum(np.ones(3))
        sys.stdout.write("rank %%d done\\n" %% r)
        sys.stdout.flush()
        """ % str(tmp_path))

    def stopped(pid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "T"
        except OSError:
            return False

    # the job stops itself; wait until both ranks are stopped
    _suspended_job_ends_with_0(tmp_path, script, lambda p, pids: _wait_until(
        lambda: all(stopped(pid) for pid in pids), p))


def _suspended_job_ends_with_0(tmp_path, script, stop):
    """Runs script at 2 ranks with MPIML_TIMEOUT=2; once both wrote pid.<r>,
    stop(p, pids) stops them, they stay stopped for twice the timeout, then
    continue: the job ends with 0, no watchdog line, both ranks done."""
    p = subprocess.Popen(mpirun(2, PY, script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=clean_env(drop=(), MPIML_TIMEOUT="2"), start_new_session=True)
    try:
        _wait_until(_rank_files(tmp_path, "pid"), p)
        pids = [int((tmp_path / ("pid.%d" % r)).read_text()) for r in range(2)]
        stop(p, pids)
        time.sleep(4)  # twice the timeout
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, out + err
        assert "watchdog" not in err, err
        assert sorted(out.split("\n")[:-1]) == ["rank 0 done", "rank 1 done"], out + err
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_stopped_and_continued_job_is_not_a_hang(tmp_path):
    """SIGSTOP then SIGCONT to every rank (Slurm's suspend) for longer than
    MPIML_TIMEOUT while one waits in a collective: the stopped time is not
    waiting; the job goes on and ends with 0."""
    script = write(tmp_path, "suspended.py", """
        import os, sys, time
        import numpy as np
        import mpiml.mpi_tools as mt
        r = mt.proc_id()
        open(os.path.join(%r, "pid.%%d" %% r), "w").write(str(os.getpid()))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 9:
            if r == 0:
                time.sleep(0.5)  # rank 1 waits for it in the allreduce
            mt.mpi_sum(np.ones(3))
        sys.stdout.write("rank %%d done\\n" %% r)  # one write per line
        sys.stdout.flush()
        """ % str(tmp_path))
    def stop(p, pids):
        time.sleep(1)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)

    _suspended_job_ends_with_0(tmp_path, script, stop)


STOPPING = """
    import os, sys, time
    import numpy as np
    import mpiml, mpiml.mpi_tools as mt
    try:
        mpiml.stop_on_signals("SIGUSR1")
        raise SystemExit("SIGUSR1 was accepted")
    except mpiml.Error as e:
        assert "report" in str(e), e
    mpiml.stop_on_signals(("SIGUSR2", "TERM"))
    r = mt.proc_id()
    open(os.path.join({dir!r}, "pid.%d" % r), "w").write(str(os.getpid()))
    for step in range(100000):
        mt.mpi_sum(np.ones(3))
        time.sleep(0.01)
        if mpiml.should_stop():
            sig = mpiml.stop_signal()
            sys.stdout.write("rank %d stopped at step %d on %s\\n" % (r, step, sig.name if sig else None))
            sys.stdout.flush()
            sys.exit(mpiml.EXIT_STOPPED)
    """


def test_stop_on_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """SIGUSR2 sent to rank 1 only: should_stop() is True on both ranks at the
    same step, the job ends with EXIT_STOPPED (75), and mpiml-run does not
    restart it."""
    if not MPIML_RUN:
        pytest.skip("mpiml-run not found (set MPIML_RUN)")
    script = write(tmp_path, "stopping.py", STOPPING.format(dir=str(tmp_path)))
    p = subprocess.Popen([MPIML_RUN, "--restarts", "1", "--backoff", "0.2", "-np", "2", PY, script],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                         start_new_session=True)
    try:
        _wait_until(_rank_files(tmp_path, "pid"), p)
        time.sleep(0.5)
        os.kill(int((tmp_path / "pid.1").read_text()), signal.SIGUSR2)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 75, out + err
        lines = sorted(l for l in out.splitlines() if "stopped at step" in l)
        assert len(lines) == 2, out + err
        steps = {re.search(r"step (\d+)", l)[1] for l in lines}
        assert len(steps) == 1, lines  # the same step on both ranks
        step = steps.pop()
        assert lines == ["rank 0 stopped at step %s on None" % step,
                         "rank 1 stopped at step %s on SIGUSR2" % step], lines
        assert "the job stopped on request (status 75); no restart" in err, err
        assert "restarting" not in err, err
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_mpiml_ppo_stops_on_sigusr2_with_a_checkpoint_and_resumes(tmp_path):
    """mpiml-ppo --cpu 2 with SIGUSR2 sent to the process the user started:
    the epoch ends, a checkpoint is saved, the job ends with 75; --resume
    auto continues from the next epoch."""
    if not MPIML_PPO:
        pytest.skip("mpiml-ppo not built (set MPIML_PPO)")
    out_dir = tmp_path / "out"
    cmd = [MPIML_PPO, "--cpu", "2", "--steps", "800", "--out", str(out_dir)]
    p = subprocess.Popen(cmd + ["--epochs", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=clean_env(), start_new_session=True)
    try:
        progress = out_dir / "progress.txt"
        _wait_until(lambda: progress.exists() and len(progress.read_text().splitlines()) >= 3, p, 120)
        p.send_signal(signal.SIGUSR2)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 75, out + err
        m = re.search(r"mpiml-ppo: stopping after epoch (\d+) on request \(SIGUSR2 on rank 0\); "
                      r"checkpoint saved in \S+: continue with --resume auto", out)
        assert m, out + err
        last = int(m[1])
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    rows = progress.read_text().splitlines()
    assert [int(r.split("\t")[0]) for r in rows[1:]] == list(range(last + 1)), rows
    again = subprocess.run(cmd + ["--epochs", str(last + 3), "--resume", "auto"], capture_output=True,
                           text=True, timeout=120, env=clean_env())
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from" in again.stdout and "(epoch %d," % last in again.stdout, again.stdout
    rows = progress.read_text().splitlines()
    assert [int(r.split("\t")[0]) for r in rows[1:]] == list(range(last + 3)), rows


MISMATCH = """
    import sys
    import numpy as np
    import mpiml
    import mpiml.mpi_tools as mt
    from mpi4py import MPI
    rank = mt.proc_id()
    comm = MPI.COMM_WORLD.Dup()
    try:
        mt.mpi_sum(np.ones(999 + rank, np.float32), comm=comm)
        print("rank %d: no error" % rank, flush=True)
    except mpiml.ArgumentError as e:
        print("rank %d caught: %s" % (rank, e), flush=True)
    print("rank %d then: %s" % (rank, mt.mpi_sum(np.ones(3), comm=comm)), flush=True)
    if sys.argv[1] == "uncaught":
        mt.broadcast(np.ones(1000 + 200 * rank, np.int32))
    """


@pytest.mark.parametrize("how", ["caught", "uncaught"])
def test_mismatch_on_mpis_path_without_the_check(tmp_path, how):
    # MPIML_CHECK off, MPI's path on one host: the check's round runs all the
    # same, before the call (every rank raises naming each rank's call, the
    # communicator goes on); an uncaught mismatch (a broadcast whose receiver
    # expects more: MPI would give it a partial result) ends the job.
    skip_without_mpi4py()
    script = write(tmp_path, "mismatch.py", MISMATCH)
    env = clean_env(MPIML_SHM="off", MPIML_CHECK="0")
    cmd = mpirun(2, PY, script, how)
    if how == "caught":
        p, _ = run(cmd, 60, env)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
    else:
        out = run_failing(cmd, within=20, env=env)
        assert re.search(r"\[mpiml\] rank ([01])/2: ArgumentError: broadcast on rank \1/2: mismatched collectives "
                         r"\(call #\d+ on this communicator\): rank 0 called broadcast\(count=1000, type=int, "
                         r"root=0\) at .*; rank 1 called broadcast\(count=1200, type=int, root=0\) .* - aborting "
                         r"the job", out), out
    for r in range(2):
        assert re.search(r"rank %d caught: mpi_sum on rank %d/2: mismatched collectives \(call #1 on this "
                         r"communicator\): rank 0 called allreduce\(count=999, type=float, op=sum\) at .*; rank 1 "
                         r"called allreduce\(count=1000, type=float, op=sum\)" % (r, r), out), out
        assert "rank %d then: [2. 2. 2.]" % r in out, out

