"""The resumable examples end to end (run by ctest at one rank: each case
launches its own jobs). A job that MPIML_INJECT kills or crashes mid-run and
that restarts (examples/ppo_resume.py through mpi_fork's restarts,
examples/ddp_resume.py under mpiml-run) must resume from a checkpoint and end
with the final parameters and progress rows of an uninterrupted job, bit for
bit."""
import os
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

PPO_EPOCHS, DDP_EPOCHS = 4, 4


def run(cmd, inject=None, timeout=90):
    """Runs a job in a session of its own; on timeout ends the whole session
    (launcher and ranks), then fails."""
    env = clean_env(**({"MPIML_INJECT": inject} if inject else {}))
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
            "--epochs", str(PPO_EPOCHS), "--steps", "400", "--out", str(out)]


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
    """The uninterrupted run's results (one per example and rank count)."""
    if (example, n) not in _baselines:
        out = tmp_path_factory.mktemp("%s_np%d" % (example, n))
        log = run(globals()[example](n, out))
        assert "resumed" not in log and "attempt" not in log, log
        _baselines[example, n] = results(out)
    return _baselines[example, n]


CASES = [  # example, ranks, injected fault (mid-run), its restart line
    ("ppo", 2, "kill:1:400", r"\[mpiml\] mpi_fork: attempt 1 of 2 failed with status \d+ "
                             r"\(rank 1/2 host [^:]+: MPIML_INJECT: kill"),
    ("ppo", 2, "segv:0:600", r"\[mpiml\] mpi_fork: attempt 1 of 2 failed with status \d+ "
                             r"\(rank 0/2 host [^:]+: .*SIGSEGV"),
    ("ddp", 2, "kill:1:60", r"\[mpiml\] mpiml-run: attempt 1 of 2 failed with status \d+ "
                             r"\(rank 1/2 host [^:]+: MPIML_INJECT: kill"),
    ("ddp", 2, "segv:0:50", r"\[mpiml\] mpiml-run: attempt 1 of 2 failed with status \d+ "
                             r"\(rank 0/2 host [^:]+: .*SIGSEGV"),
    ("ddp", 3, "kill:2:40", r"\[mpiml\] mpiml-run: attempt 1 of 2 failed with status \d+ "
                             r"\(rank 2/3 host [^:]+: MPIML_INJECT: kill"),
]


@pytest.mark.parametrize("example,n,inject,line", CASES,
                         ids=["%s-np%d-%s" % (c[0], c[1], c[2].split(":")[0]) for c in CASES])
def test_restarted_run_equals_uninterrupted_run(tmp_path_factory, example, n, inject, line):
    epochs = PPO_EPOCHS if example == "ppo" else DDP_EPOCHS
    progress, params = baseline(tmp_path_factory, example, n)
    assert progress.count("\n") == 1 + epochs, progress
    out = tmp_path_factory.mktemp("%s_np%d_%s" % (example, n, inject.replace(":", "_")))
    log = run(globals()[example](n, out, restarts=1), inject=inject)
    assert re.search(line, log), log
    assert "attempt 2 of" not in log, log
    # Resumed from a checkpoint, not started over: the fault came after epoch 1.
    resumed = re.findall(r"^resumed from epoch (\d+)$", log, re.M)
    assert len(resumed) == 1 and 1 <= int(resumed[0]) < epochs, log
    got_progress, got_params = results(out)
    assert got_progress == progress
    assert got_params.keys() == params.keys()
    for k in params:
        assert got_params[k] == params[k], "%s differs from the uninterrupted run's" % k
