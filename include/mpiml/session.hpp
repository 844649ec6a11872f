// MPI lifetime: lazy initialization, RAII session, proc_id / num_procs.
#pragma once

#include <mpiml/failure.hpp>  // every user of mpiml registers its exit handler

#include <mpi.h>

#include <optional>

namespace mpiml {

/// A communicator argument. Default-constructed, it means the session's
/// default communicator (MPI_COMM_WORLD unless a Session chose another).
class Comm {
public:
    Comm() = default;
    Comm(MPI_Comm c) : comm_(c), set_(true) {}  // NOLINT: implicit on purpose
    /// The raw communicator; initializes MPI lazily. `call` names the caller
    /// in errors.
    MPI_Comm get(const char* call = "mpiml") const;

private:
    MPI_Comm comm_{};
    bool set_ = false;
};

struct SessionOptions {
    /// Thread level requested from MPI_Init_thread.
    int thread_level = MPI_THREAD_FUNNELED;
    /// Default communicator for calls that do not name one (null: world).
    MPI_Comm comm = MPI_COMM_NULL;
    /// Collective deadline in seconds (0: off). Unset: MPIML_TIMEOUT.
    std::optional<double> timeout;
    /// Cross-rank mismatch checks before each collective. Unset: MPIML_CHECK
    /// (default on in Debug builds of mpiml, off otherwise).
    std::optional<bool> check;
    /// Install the abort-on-failure handlers (uncaught exception, fatal signals).
    bool abort_on_failure = true;
};

/// Explicit MPI lifetime. Initializes MPI if nobody has, and finalizes it in
/// the destructor if it initialized it. If the destructor runs while an
/// exception is unwinding, the job is aborted instead: finalizing on one rank
/// while the others wait in a collective would hang them forever.
class Session {
public:
    explicit Session(SessionOptions opts = {});
    Session(int& argc, char**& argv, SessionOptions opts = {});
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    MPI_Comm comm() const;
    int rank() const;
    int size() const;
    int thread_level() const;  ///< the level MPI provided

private:
    void start(int* argc, char*** argv, const SessionOptions& opts);
    bool owns_ = false;
    MPI_Comm previous_comm_ = MPI_COMM_NULL;
};

/// Initializes MPI if needed (MPI_Init_thread, MPI_ERRORS_RETURN, handlers).
/// Called by every mpiml function; safe to call many times. Throws
/// mpiml::Error after MPI_Finalize.
void ensure_initialized(const char* call = "mpiml");
/// Finalizes MPI if mpiml initialized it (also done automatically at exit).
void finalize();
bool is_initialized();
bool is_finalized();

/// Rank of the calling process (seed: proc_id()).
int proc_id(Comm comm = {});
/// Number of processes (seed: num_procs()).
int num_procs(Comm comm = {});

/// Per-call options, changeable at run time.
void set_timeout(double seconds);  ///< collective deadline; 0 turns it off
double timeout();
void set_check(bool on);           ///< cross-rank mismatch checks (alike on every rank)
bool check_enabled();

namespace detail {
/// Settings that other doors read (all variables are read in config.cpp):
/// MPIML_C10D_CHECK (the torch.distributed backend's agreement round), and
/// whether MPIML_PROFILE asks for a profile.
std::optional<bool> env_c10d_check();
bool env_profile_requested();
/// This process was started by an MPI launcher (mpirun, mpiexec, srun) or by
/// mpi_fork (IN_MPI): mpi_fork does nothing then.
bool started_by_launcher();
}  // namespace detail

}  // namespace mpiml
