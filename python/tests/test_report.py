"""Where every rank is, for a Python program: 3-rank jobs launched from the
test (run by ctest at one rank), checked by tests/run_report_test.sh like the
C++ program's: the report on a hang names the late rank's Python line and the
others' collective, SIGUSR1 and mpiml-report print it and the job goes on,
and a mismatch names each rank's Python call site."""
import os
import pathlib
import subprocess
import sys

import pytest

from test_jobs import clean_env, mpirun  # noqa: E402 (the jobs' environment and launcher)

HERE = pathlib.Path(__file__).resolve().parent
CHECK = HERE.parent.parent / "tests" / "run_report_test.sh"
CHILD = HERE / "hang_child.py"


@pytest.mark.parametrize("case", ["hang", "hang0", "signal", "command", "mismatch"])
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
