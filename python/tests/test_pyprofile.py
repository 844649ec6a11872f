"""Python profiles (cProfile per rank) of whole MPI jobs launched from the
test (run by ctest at one rank): profile_<rank>.prof on every rank, and the
summary's table of Python functions that differ between ranks."""
import csv
import json
import os
import pstats
import re
import subprocess
import sys
import textwrap
import time

from test_jobs import clean_env as _clean_env, mpirun  # noqa: E402 (the jobs' environment and launcher)

PY = sys.executable
RANKS = 3

PROGRAM = """
    import sys, time
    import numpy as np
    import mpiml, mpiml.mpi_tools as mt

    def slow_part():
        time.sleep(1.0)

    def step(r):
        if r == 2:
            slow_part()  # the others wait for rank 2 in the allreduce
        mt.mpi_sum(np.ones(3))

    r = mt.proc_id()
    if sys.argv[1] == "env":
        step(r)
    else:  # profile_start / profile_stop inside the program, twice
        mpiml.profile_start(sys.argv[2])
        assert mpiml.profiling()
        step(r)
        mpiml.profile_stop()
        assert not mpiml.profiling() and not mpiml._pyprofile.running()
        step(r)  # not profiled
        mpiml.profile_start(sys.argv[3])
        mt.mpi_sum(np.ones(3))
        mpiml.profile_stop()
    sys.stdout.flush()
    """


def clean_env(**extra):
    """test_jobs' environment for the jobs, keeping MPIML_TIMEOUT and dropping
    MPIML_PROFILE (each test sets its own)."""
    return _clean_env(drop=("MPIML_PROFILE",), **extra)


def run(tmp_path, *args, **env):
    script = tmp_path / "imbalance.py"
    script.write_text(textwrap.dedent(PROGRAM))
    p = subprocess.run(mpirun(RANKS, PY, str(script), *args), capture_output=True, text=True,
                       timeout=120, env=clean_env(**env))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "[mpiml]" not in p.stderr, p.stderr
    return p


def python_rows(d):
    return json.loads((d / "summary.json").read_text())["python"]["rows"]


def check_profile(d, stdout, slow_rank_expected=True):
    """Every rank's .prof loads with pstats; the table names slow_part on rank 2."""
    for r in range(RANKS):
        s = pstats.Stats(str(d / ("profile_%d.prof" % r)))
        slow = [v for k, v in s.stats.items() if k[2] == "slow_part"]
        if r == 2:
            assert slow and slow[0][3] > 0.9, s.stats.keys()  # cumulative time of its sleep
        else:
            assert not slow
    rows = python_rows(d)
    top = [row for row in rows if row["name"] == "slow_part"]
    assert top, rows
    row = top[0]
    assert row["slowest_rank"] == 2 and row["max_s"] > 0.9 and row["min_s"] == 0.0, row
    assert abs(row["mean_s"] - row["max_s"] / RANKS) < 1e-9 and row["function"].endswith(":6 slow_part")
    assert rows.index(row) <= 1, rows  # the largest excess (with time.sleep, which it calls)
    # the ranks that waited: the allreduce is slow on the others
    mpi = [row for row in rows if "mpi_sum" in row["name"]]
    assert mpi and mpi[0]["slowest_rank"] != 2, rows
    # printed by rank 0 after the regions' table, and in summary.csv
    lines = [line for line in stdout.splitlines() if "slow_part" in line]
    assert len(lines) == 1 and "rank 2" in lines[0], stdout
    with open(d / "summary.csv", newline="") as f:
        table = list(csv.DictReader(f))
    py = [t for t in table if t["kind"] == "python" and t["name"].endswith(" slow_part")]
    assert len(py) == 1 and py[0]["slowest_rank"] == "2", table
    assert any(t["kind"] == "mpi" and t["slowest_rank"] == "" for t in table), table


def test_mpiml_profile_environment_writes_python_profiles(tmp_path):
    d = tmp_path / "prof"
    p = run(tmp_path, "env", MPIML_PROFILE=str(d))
    check_profile(d, p.stdout)
    assert sorted(os.listdir(d)) == sorted(
        ["profile_%d.%s" % (r, ext) for r in range(RANKS) for ext in ("json", "prof")] +
        ["imbalance.svg", "summary.csv", "summary.json", "timeline.json"])


def test_profile_start_stop_from_python(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    p = run(tmp_path, "api", str(a), str(b))
    check_profile(a, p.stdout)
    # the second profile: its own files, no slow_part (it ran between the profiles)
    for r in range(RANKS):
        s = pstats.Stats(str(b / ("profile_%d.prof" % r)))
        assert not [k for k in s.stats if k[2] in ("slow_part", "step")], s.stats.keys()
        assert [k for k in s.stats if "mpi_sum" in k[2]]
    assert not [row for row in python_rows(b) if row["name"] == "slow_part"]


def test_rank_ending_early_under_mpiml_profile_ends_the_job(tmp_path):
    """The Python profile is written at exit with collectives: a rank that
    ends while another waits in a collective still ends the job (exit guard),
    never a hang."""
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent("""
        import sys
        import numpy as np
        import mpiml.mpi_tools as mt
        mt.mpi_sum(np.ones(3))
        if mt.proc_id() == 1:
            sys.exit(0)
        mt.mpi_sum(np.ones(3))  # waits for rank 1, which has ended
        """))
    p = subprocess.run(mpirun(2, PY, str(script)), capture_output=True, text=True, timeout=60,
                       env=clean_env(MPIML_PROFILE=str(tmp_path / "prof")))
    assert p.returncode != 0
    assert "[mpiml] rank 1/2:" in p.stdout + p.stderr and "rank 0 waits in allreduce #2" in \
        p.stdout + p.stderr, p.stdout + p.stderr


def test_rank_that_ends_the_job_by_an_exception_writes_its_own_profile(tmp_path):
    """Writing the profile is collective, so a failed job's is lost but for
    the rank that ends it: its cProfile statistics and its timeline, written
    on the way out, named on stderr."""
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import mpiml.mpi_tools as mt

        def own_work():
            return sum(i * i for i in range(20000))

        for _ in range(3):
            mt.mpi_sum(np.ones(3) * own_work())
        if mt.proc_id() == 1:
            raise ValueError("injected")
        mt.barrier()  # waits for rank 1
        """))
    d = tmp_path / "prof"
    p = subprocess.run(mpirun(2, PY, str(script)), capture_output=True, text=True, timeout=60,
                       env=clean_env(MPIML_PROFILE=str(d)))
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "[mpiml] rank 1/2: ValueError: injected - aborting the job" in out, out
    assert "[mpiml] rank 1/2: its Python profile until it ended the job: %s/profile_1.prof" % d in out, out
    assert "[mpiml] rank 1/2: its profile until it ended the job: %s/profile_1.json" % d in out, out
    stats = pstats.Stats(str(d / "profile_1.prof")).stats
    assert any(k[2] == "own_work" and v[1] == 3 for k, v in stats.items()), sorted(stats)[:20]
    trace = json.loads((d / "profile_1.json").read_text())
    assert trace["otherData"]["rank"] == 1, trace["otherData"]
    assert "alone" in trace["otherData"]["wait_times"], trace["otherData"]
    sums = [e for e in trace["traceEvents"] if e.get("cat") == "mpi" and e["args"]["call"] == "mpi_sum"]
    assert [e["args"]["seq"] for e in sums] == [1, 2, 3], sums
    assert not (d / "timeline.json").exists()  # collective: not written


def run_slow_exit(tmp_path, slow_s, others_status, others_delay_s):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_exit.py")
    d = tmp_path / "prof"
    t0 = time.monotonic()
    p = subprocess.run(mpirun(2, PY, script, str(slow_s), str(others_status), str(others_delay_s), "1"),
                       capture_output=True, text=True, timeout=90, env=clean_env(MPIML_PROFILE=str(d)))
    assert (d / "profile_1.prof").exists() and (d / "summary.json").exists(), p.stdout + p.stderr
    return p, time.monotonic() - t0


def test_stopped_job_keeps_its_status_when_a_slow_exit_gets_sigterm(tmp_path):
    """Under MPIML_PROFILE the ranks pass the exit guard in an atexit handler,
    before Python knows their status. Every rank stops (75); rank 1's exit
    goes on 0.5 s after that and gets SIGTERM as it begins (srun -K's, once
    another task ended): it completes its exit and the job ends with 75, not
    terminated. (The others finalize MPI and end 1 s later: under Open MPI's
    mpirun a rank still in MPI_Finalize when another ends non-zero cannot
    complete it.)"""
    p, _ = run_slow_exit(tmp_path, 0.5, 75, 1.0)
    assert p.returncode == 75, p.stdout + p.stderr
    assert "slow_exit: rank 1 finished its exit" in p.stderr, p.stdout + p.stderr


def test_an_exit_that_outlasts_a_sigterm_by_5_s_ends_by_it(tmp_path):
    """The same with rank 1's exit lasting 60 s (the others end with 0, so
    the launcher waits for it): 5 s after the SIGTERM it ends by that signal,
    its status still unknown to Python's exit handlers; no hang."""
    p, secs = run_slow_exit(tmp_path, 60, 0, 0)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "slow_exit: rank 1 finished its exit" not in out, out
    assert secs < 40, (secs, out)


def test_unwritable_profile_file_raises_on_every_rank(tmp_path):
    """A rank that cannot write its .prof: every rank raises mpiml.Error
    naming the call, its rank and the rank that failed; no hang."""
    script = tmp_path / "unwritable.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import mpiml, mpiml.mpi_tools as mt
        d = sys.argv[1]
        mpiml.profile_start(d)
        mt.mpi_sum(1.0)
        if mt.proc_id() == 1:
            os.mkdir(os.path.join(d, "profile_1.prof"))  # a directory: not writable as a file
        try:
            mpiml.profile_stop()
        except mpiml.Error as e:
            sys.stdout.write("caught: %s\\n" % e)  # one write: ranks' lines never interleave
            sys.stdout.flush()
        mt.mpi_sum(1.0)  # the ranks still agree
        """))
    p = subprocess.run(mpirun(2, PY, str(script), str(tmp_path / "prof")), capture_output=True,
                       text=True, timeout=120, env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    caught = sorted(re.findall(r"caught: [^\n]*", p.stdout))
    assert len(caught) == 2, p.stdout
    assert "mpiml.profile_stop on rank 0/2: the Python profile of rank 1 was not written" in caught[0]
    assert "mpiml.profile_stop on rank 1/2: cannot write" in caught[1] and "profile_1.prof" in caught[1]


def test_region_on_a_generator_times_each_resume_and_profile_start_without_stop(tmp_path):
    """@mpiml.region on a generator function times its work (each resume is
    one call), not the creation of the generator; a coroutine function is a
    TypeError. A profile started with profile_start and never stopped is
    written at exit, Python half included."""
    script = tmp_path / "gen.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        import numpy as np
        import mpiml, mpiml.mpi_tools as mt

        @mpiml.region("rollout")
        def rollout(n):
            for i in range(n):
                time.sleep(0.1)
                got = yield i
                assert got is None
            return "done"

        try:
            @mpiml.region("coro")
            async def coro():
                pass
            raise SystemExit("a coroutine function was accepted")
        except TypeError as e:
            assert "coroutine" in str(e), e

        mpiml.profile_start(sys.argv[1])
        assert list(rollout(3)) == [0, 1, 2]
        g = rollout(5)
        next(g)
        try:
            g.throw(KeyError("into the generator"))
        except KeyError:
            pass
        mt.mpi_sum(np.ones(3))
        # no profile_stop: written at exit
        """))
    d = tmp_path / "prof"
    p = subprocess.run(mpirun(2, PY, str(script), str(d)), capture_output=True, text=True,
                       timeout=120, env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((d / "summary.json").read_text())
    row = [r for r in summary["rows"] if r["name"] == "rollout"]
    assert row, summary["rows"]
    # 3 sleeps + the end of the first, 1 sleep + the throw of the second
    assert row[0]["calls_min"] == 6 and row[0]["min_s"] > 0.35, row
    for r in range(2):
        assert (d / ("profile_%d.prof" % r)).exists(), os.listdir(d)
    assert summary["python"]["rows"] is not None
