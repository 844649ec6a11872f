"""The resumable examples end to end (run by ctest at one rank: each case
launches its own jobs). A job that MPIML_INJECT kills or crashes mid-run and
that restarts (examples/ppo_resume.py through mpi_fork's restarts,
examples/ddp_resume.py under mpiml-run) must resume from a checkpoint and end
with the final parameters and progress rows of an uninterrupted job, bit for
bit."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_jobs import clean_env

PY = sys.executable
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# mpiml-run as built (ctest sets MPIML_RUN), else the one on PATH.
MPIML_RUN = os.environ.get("MPIML_RUN") or shutil.which("mpiml-run")

PPO_EPOCHS, DDP_EPOCHS = 3, 4


def run(cmd, timeout=90, **env):
    """Runs a job in a session of its own; on timeout ends the whole session
    (launcher and ranks), then fails."""
    env = clean_env(**env)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)  # the launcher ends its ranks
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        pytest.fail("%s did not end within %d s:\n%s" % (" ".join(cmd), timeout, out))
    assert p.returncode == 0, out
    return out


def ppo(n, out, restarts=0):
    return [PY, str(EXAMPLES / "ppo_resume.py"), "--cpu", str(n), "--restarts", str(restarts),
            "--epochs", str(PPO_EPOCHS), "--steps", "200", "--out", str(out)]


def ddp(n, out, restarts=0):
    if not MPIML_RUN:
        pytest.skip("mpiml-run not found (set MPIML_RUN)")
    return [MPIML_RUN, "--restarts", str(restarts), "--backoff", "0.2", "-np", str(n),
            PY, str(EXAMPLES / "ddp_resume.py"), "--epochs", str(DDP_EPOCHS), "--out", str(out)]


def results(out):
    """(progress.txt's text, {name: (dtype, shape, bytes)} of final.pt)."""
    state = torch.load(out / "final.pt")
    return (out / "progress.txt").read_text(), \
        {k: (v.dtype, tuple(v.shape), v.numpy().tobytes()) for k, v in state.items()}


_baselines = {}


def baseline(tmp_path_factory, example, n):
    """The uninterrupted run's results (one per example and rank count), and
    each rank's count of collectives (from its profile), to inject faults at."""
    if (example, n) not in _baselines:
        out = tmp_path_factory.mktemp("%s_np%d" % (example, n))
        log = run(globals()[example](n, out), MPIML_PROFILE=str(out / "profile"))
        assert "resumed" not in log and "attempt" not in log, log
        counts = []
        for r in range(n):
            events = json.loads((out / "profile" / ("profile_%d.json" % r)).read_text())
            counts.append(sum(e.get("cat") == "mpi" for e in events["traceEvents"]))
        _baselines[example, n] = results(out) + (counts,)
    return _baselines[example, n]


CASES = [  # example, ranks, fault, faulty rank, when (a fraction of its collectives)
    ("ppo", 2, "kill", 1, 0.5),
    ("ppo", 2, "segv", 0, 0.75),
    ("ppo", 2, "stall", 1, None),
    ("ddp", 2, "kill", 1, None),
    ("ddp", 2, "segv", 0, 0.75),
    ("ddp", 2, "stall", 0, None),
    ("ddp", 3, "kill", 2, 0.6),
]
# What the restart line names: the failing rank's own line, or for a stall
# the watchdog line of a rank that waited for it (MPIML_TIMEOUT).
WHAT = {"kill": "MPIML_INJECT: kill", "segv": "fatal signal SIGSEGV", "stall": "watchdog: "}


@pytest.mark.parametrize("example,n,fault,rank,when", CASES,
                         ids=["%s-np%d-%s" % c[:3] for c in CASES])
def test_restarted_run_equals_uninterrupted_run(tmp_path_factory, example, n, fault, rank, when):
    epochs = PPO_EPOCHS if example == "ppo" else DDP_EPOCHS
    progress, params, counts = baseline(tmp_path_factory, example, n)
    assert progress.count("\n") == 1 + epochs, progress
    if when is None:  # a random collective of the middle of the run (printed, to replay)
        when = random.uniform(0.4, 0.8)
    inject = "%s:%d:%d" % (fault, rank, int(when * counts[rank]))
    print("MPIML_INJECT=" + inject)
    out = tmp_path_factory.mktemp("%s_np%d_%s" % (example, n, fault))
    extra = {"MPIML_TIMEOUT": "3"} if fault == "stall" else {}
    log = run(globals()[example](n, out, restarts=1), MPIML_INJECT=inject, **extra)
    launcher = "mpi_fork" if example == "ppo" else "mpiml-run"
    who = r"\d" if fault == "stall" else str(rank)
    line = r"\[mpiml\] %s: attempt 1 of 2 failed with status \d+ \(rank %s/%d host [^:]+: %s" \
        % (launcher, who, n, WHAT[fault])
    assert re.search(line, log), (inject, log)
    assert "attempt 2 of" not in log, log
    # Resumed from a checkpoint, not started over (the fault came after the first).
    resumed = re.findall(r"^resumed from epoch (\d+)$", log, re.M)
    assert len(resumed) == 1 and 1 <= int(resumed[0]) < epochs, (inject, log)
    got_progress, got_params = results(out)
    assert got_progress == progress
    assert got_params.keys() == params.keys()
    for k in params:
        assert got_params[k] == params[k], "%s differs from the uninterrupted run's" % k
