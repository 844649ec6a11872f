"""Job-wide failure handling, per-call options and profiling from Python.

Never a hang: importing mpiml installs sys.excepthook and
threading.excepthook. When an exception escapes (the main thread or any
other thread) while MPI runs with more than one rank in MPI_COMM_WORLD, the
rank prints the usual traceback, then one line

    [mpiml] rank R/N: <ExceptionType>: <message> - aborting the job

and aborts the whole job (MPI_Abort), so no peer waits forever in a
collective. With one rank, or before MPI is initialized, Python's own
behaviour is kept (the exit status is non-zero, which ends an MPI job too).
KeyboardInterrupt counts as an exception: Ctrl-C ends every rank.
"""
import atexit
import functools
import inspect
import os
import sys
import threading

from . import _core
from .errors import ArgumentError
from . import _pyprofile

_prev_excepthook = None
_stop_registered = False  # _profile_stop_at_exit registered with atexit
_prev_threading_hook = None


def _abort_line(exc_type, exc_value):
    text = str(exc_value)
    return "%s: %s" % (exc_type.__name__, text) if text else exc_type.__name__


def _running_world():
    """(rank, size) of MPI_COMM_WORLD while MPI runs, else None."""
    try:
        return _core.world()
    except Exception:  # noqa: BLE001 - never fail inside an excepthook
        return None


def _own_profile(world):
    """A rank that ends the job writes its own Python profile (its C++
    profile is written by abort_job)."""
    if _pyprofile.running():
        try:
            directory = _core.profile_dir()
        except Exception:  # noqa: BLE001 - never fail inside an excepthook
            directory = ""
        _pyprofile.write_own(directory, world[0], world[1])


def _excepthook(exc_type, exc_value, tb):
    world = _running_world()
    (_prev_excepthook or sys.__excepthook__)(exc_type, exc_value, tb)
    if world is not None and world[1] > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        _own_profile(world)
        _core.abort_job(_abort_line(exc_type, exc_value), 1)


def _threading_excepthook(args):
    if args.exc_type is SystemExit:
        return (_prev_threading_hook or threading.__excepthook__)(args)
    world = _running_world()
    (_prev_threading_hook or threading.__excepthook__)(args)
    if world is not None and world[1] > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        _own_profile(world)
        _core.abort_job(_abort_line(args.exc_type, args.exc_value), 1)


def install_excepthooks():
    """Installs the hooks (done when mpiml is imported; idempotent)."""
    global _prev_excepthook, _prev_threading_hook
    if sys.excepthook is not _excepthook:
        _prev_excepthook = sys.excepthook
        sys.excepthook = _excepthook
    if threading.excepthook is not _threading_excepthook:
        _prev_threading_hook = threading.excepthook
        threading.excepthook = _threading_excepthook


def abort_job(message, code=1):
    """Prints "[mpiml] rank R/N: <message> - aborting the job" and ends every rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    _core.abort_job(str(message), int(code))


# ------------------------------------------------------------ per-call options
def report(reason="requested by the program"):
    """Prints where every rank is (host, pid, collective, last collectives,
    stacks) on rank 0's stderr and into MPIML_REPORT_DIR, and returns the
    text. Any rank, any thread, not collective: the job goes on."""
    return _core.report(str(reason))


def set_timeout(seconds):
    """Collective deadline in seconds (0: off); MPIML_TIMEOUT sets it at start.
    A rank that waits longer in one collective ends the job with a message
    naming the call."""
    _core.set_timeout(float(seconds))


def timeout():
    return _core.timeout()


def set_check(on):
    """Cross-rank mismatch checks before each collective (MPIML_CHECK=1)."""
    _core.set_check(bool(on))


def check_enabled():
    return _core.check_enabled()


# ------------------------------------------------------------ stopping on a signal
EXIT_STOPPED = _core.EXIT_STOPPED


def stop_on_signals(signals=("SIGUSR2",)):
    """From now on the given signals (names such as "SIGUSR2" or "TERM", or
    signal numbers) no longer end this rank: each sets a flag that
    should_stop() reads. Call it on every rank. A batch system's warning
    before a time limit or a preemption then becomes a checkpoint and a
    clean end:

        mpiml.stop_on_signals(("SIGUSR2", "SIGTERM"))
        for epoch in range(start, epochs):
            train_one_epoch()
            if mpiml.should_stop():      # collective: the same answer on every rank
                save_checkpoint(...)
                sys.exit(mpiml.EXIT_STOPPED)   # 75: restarting launchers do not restart it

    SIGUSR1 (reports), SIGKILL, SIGSTOP and fatal signals raise mpiml.Error."""
    import signal as _signal
    if isinstance(signals, (str, int)):
        signals = (signals,)
    numbers = []
    for s in signals:
        if isinstance(s, str):
            name = s.upper() if s.upper().startswith("SIG") else "SIG" + s.upper()
            try:
                numbers.append(int(_signal.Signals[name]))
            except KeyError:
                raise ArgumentError("mpiml.stop_on_signals: no signal named %r" % (s,)) from None
        else:
            numbers.append(int(s))
    _core.stop_on_signals(numbers)


def stop_requested():
    """This rank got one of the stop_on_signals signals (local)."""
    return _core.stop_requested()


def stop_signal():
    """The first such signal this rank got (a signal.Signals), or None."""
    import signal as _signal
    s = _core.stop_signal()
    return _signal.Signals(s) if s else None


def should_stop(comm=None):
    """Collective: True on every rank when any rank got one of the
    stop_on_signals signals (one allreduce)."""
    return _core.should_stop(comm)


# ------------------------------------------------------------ profiling
def profile_start(directory):
    """Starts profiling into directory (collective; MPIML_PROFILE=dir does it at start).
    Also runs cProfile on the calling thread."""
    global _stop_registered
    from .checkpoint import _path
    _core.profile_start(_path(directory, "profile_start"))
    _pyprofile.start()
    if not _stop_registered:  # a profile never stopped is written at exit
        _stop_registered = True
        atexit.register(_profile_stop_at_exit)


def profile_stop():
    """Stops profiling and writes the per-rank traces, cProfile files
    (profile_<rank>.prof), timeline and summary (collective)."""
    if _pyprofile.running():
        _pyprofile.pause()
        _core.init()  # with MPIML_PROFILE, the profile starts when MPI does
    directory = _core.profile_dir()
    _core.profile_stop()
    if directory:  # the same on every rank, whether or not cProfile ran there
        _pyprofile.stop(directory)
    else:
        _pyprofile.discard()


def _profile_stop_at_exit():
    # MPIML_PROFILE: write the profile now, while the interpreter runs (MPI is
    # finalized after it). The exit guard of MPI_Finalize runs first: it waits
    # until every rank has ended, so the collectives below cannot meet a peer
    # still inside the program's collectives (it aborts the job if one waits
    # in a collective this rank never entered).
    if not _pyprofile.running():
        return
    if not _core.is_initialized() or _core.is_finalized():
        _pyprofile.discard()  # no MPI, no profile (as for the C++ side)
        return
    _pyprofile.pause()
    sys.stdout.flush()
    sys.stderr.flush()
    _core._exit_guard()
    try:
        profile_stop()
    except Exception as e:  # noqa: BLE001 - at exit: report, do not raise
        sys.stdout.flush()
        print("[mpiml] profile not written: %s" % e, file=sys.stderr, flush=True)


def profiling():
    return _core.profiling()


def profile_dir():
    return _core.profile_dir()


class region:
    """A named profiling region: a context manager or a decorator.

        with mpiml.region("rollout"):
            ...

        @mpiml.region("update")
        def update(data): ...

    Costs one check when profiling is off.
    """

    def __init__(self, name):
        self.name = str(name)
        self._stack = []

    def __enter__(self):
        r = _core.Region(self.name)
        r.enter()
        self._stack.append(r)
        return self

    def __exit__(self, *exc):
        self._stack.pop().exit()
        return False

    def __call__(self, fn):
        name = self.name
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError("mpiml.region(%r): cannot time a coroutine function (its time is spread "
                            "over its awaits); use `with mpiml.region(...)` around the parts to time"
                            % name)
        if inspect.isgeneratorfunction(fn):
            # The generator's own work: each resume (next, send, throw) is one region.
            @functools.wraps(fn)
            def generator(*args, **kwargs):
                gen = fn(*args, **kwargs)
                value, error = None, None
                while True:
                    r = _core.Region(name)
                    r.enter()
                    try:
                        item = gen.send(value) if error is None else gen.throw(error)
                    except StopIteration as stop:
                        return stop.value
                    finally:
                        r.exit()
                    value, error = None, None
                    try:
                        value = yield item
                    except GeneratorExit:
                        gen.close()
                        raise
                    except BaseException as e:  # noqa: BLE001 - thrown in: passed on
                        error = e

            return generator

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            r = _core.Region(name)
            r.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                r.exit()

        return wrapper


def _profile_requested():
    try:
        return _core._env_profile_requested()
    except RuntimeError:  # a malformed variable: reported when MPI starts
        return False


install_excepthooks()
if _profile_requested() and not _pyprofile.running():
    _pyprofile.start()
    _stop_registered = True
    atexit.register(_profile_stop_at_exit)
# A rank that ends before any mpiml call, in a job where mpi4py started MPI,
# still meets the others at the exit guard's door (atexit handlers run
# before mpi4py finalizes MPI).
atexit.register(_core._exit_guard_unstarted)
# A rank's children (multiprocessing's spawn, a subprocess given a copy of
# os.environ) must see that they are not the process the launcher started:
# only that one starts MPI on its way out when it ends before starting it.
if _core._rank_process_mark() is not None:
    os.environ["MPIML_RANK_PROCESS"] = _core._rank_process_mark()
# Objects the interpreter destroys after the atexit handlers (a GradAverager
# kept to the end) leave their collective frees to MPI_Finalize, which runs
# the exit guard first: a rank that ends while another waits in a collective
# ends the job with a line naming both, not a hang in a destructor.
atexit.register(_core._defer_collective_frees)
# Reports show Python stacks until the interpreter starts to go away (atexit
# handlers run first at interpreter exit; MPI ends after the interpreter).
atexit.register(_core._forget_python_stacks)
