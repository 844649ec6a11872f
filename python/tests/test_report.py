"""Where every rank is, for a Python program: 3-rank jobs launched from the
test (run by ctest at one rank), checked by tests/run_report_test.sh like the
C++ program's: the report on a hang names the late rank's Python line and the
others' collective, SIGUSR1 and mpiml-report print it and the job goes on,
a stall warning prints it once and the job goes on, and a mismatch names
each rank's Python call site."""
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from test_jobs import clean_env, mpirun  # noqa: E402 (the jobs' environment and launcher)

HERE = pathlib.Path(__file__).resolve().parent
CHECK = HERE.parent.parent / "tests" / "run_report_test.sh"
CHILD = HERE / "hang_child.py"


@pytest.mark.parametrize("case", ["hang", "hang0", "signal", "command", "stall", "mismatch"])
def test_report(case):
    tool = os.environ.get("MPIML_REPORT_TOOL", "")
    if case == "command" and not os.access(tool, os.X_OK):
        pytest.skip("MPIML_REPORT_TOOL (the mpiml-report program) is not set")
    launcher, _np, _n, *flags = mpirun(3)
    p = subprocess.run(["bash", str(CHECK), launcher, " ".join(flags), case, sys.executable, str(CHILD)],
                       capture_output=True, text=True, timeout=90,
                       env=clean_env(drop=("MPIML_TIMEOUT", "MPIML_CHECK"), REPORT_SOURCE=str(CHILD),
                                     REPORT_TOOL=tool))
    assert p.returncode == 0, p.stdout + p.stderr


def test_python_stacks_of_running_threads_are_read_safely():
    """A report on demand reads every Python thread's frames while the job
    goes on: with the GIL held (threads that run push and pop frames), never
    a crash; when the GIL stays taken (C code holds it), after a second
    without it."""
    import threading
    import time
    from mpiml import _core

    def deep(n):
        return [i for i in range(20)] if n == 0 else deep(n - 1)

    def churn_worker(stop):
        while not stop.is_set():
            for d in (1, 50, 80, 5, 90):  # within the dumper's 100 frames a thread
                deep(d)
            sum(x for x in range(100))

    stop = threading.Event()
    threads = [threading.Thread(target=churn_worker, args=(stop,)) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(300):
            text = _core._python_stacks()
            assert "churn_worker" in text, text
            assert "test_python_stacks_of_running_threads_are_read_safely" in text, text
            assert "<no Python frame>" not in text, text  # the reading thread is left out
        t0 = time.monotonic()
        text = _core._python_stacks(release_gil=False)
        assert 0.9 < time.monotonic() - t0 < 5, time.monotonic() - t0
        assert "test_python_stacks_of_running_threads_are_read_safely" in text, text
    finally:
        stop.set()
        for t in threads:
            t.join()


SIGNAL_SCRIPT = """
    import sys, time
    import mpiml
    sys.stdout.write("ready\\n")  # one write per line: ranks' lines never interleave
    sys.stdout.flush()
    time.sleep(4)  # e.g. loading data, before mpiml starts MPI
    import mpiml.mpi_tools as mt
    mt.barrier()
    sys.stdout.write("done %d\\n" % mt.proc_id())
    sys.stdout.flush()
    """


def test_sigusr1_before_mpi_started_does_not_end_the_job(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent(SIGNAL_SCRIPT))
    p = subprocess.Popen(mpirun(2, sys.executable, str(script)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        lines = [p.stdout.readline(), p.stdout.readline()]
        assert lines == ["ready\n", "ready\n"], lines
        time.sleep(0.5)
        p.send_signal(signal.SIGUSR1)  # mpirun hands it to every rank
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, out + err
        assert sorted(out.split("\n")[:-1]) == ["done 0", "done 1"], out + err
        assert err.count("SIGUSR1 before mpiml started MPI: no report yet; the rank goes on") == 2, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_hang_with_the_report_agent_off_prints_each_waiting_rank(tmp_path):
    """MPIML_REPORT=0: no agent, and a hang still ends the job with each
    waiting rank's own line and section (not a rank killed by the signal that
    asks threads for their stacks)."""
    p = subprocess.run(mpirun(3, sys.executable, str(CHILD), "hang"), capture_output=True, text=True,
                       timeout=60, env=clean_env(drop=("MPIML_TIMEOUT", "MPIML_CHECK"), MPIML_REPORT="0",
                                                 MPIML_TIMEOUT="2", MPIML_REPORT_DIR=str(tmp_path)))
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "Real-time signal" not in out and "signal 38" not in out, out
    assert "watchdog: mpiml::barrier waited" in out, out
    assert "[mpiml] report of this rank only (no report agent)" in out, out
    assert re.search(r"==== rank [01]/3 .*in barrier", out), out
