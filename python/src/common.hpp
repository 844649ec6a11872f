// Shared by the mpiml extension modules (header-only: each module has its
// copy; the MPI state itself lives in libmpiml).
#pragma once

#include <mpiml/mpiml.hpp>

#include <pybind11/pybind11.h>

#include <atomic>
#include <mutex>
#include <string>
#include <string_view>

namespace py = pybind11;

namespace mpiml::python {

// ------------------------------------------------------------ errors
inline py::object errors_module() {
    static py::object* m = new py::object(py::module_::import("mpiml.errors"));
    return *m;
}

inline void ensure_initialized_py();

[[noreturn]] inline void raise(const char* cls, const std::string& call, const std::string& what) {
    const std::string text = call + " on " + detail::rank_tag() + ": " + what;
    py::object type = errors_module().attr(cls);
    py::object e = type(text);
    e.attr("call") = call;
    int rank = -1;
    if (is_initialized() && !is_finalized()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    e.attr("rank") = rank;
    e.attr("mpi_code") = 0;
    PyErr_SetObject(type.ptr(), e.ptr());
    throw py::error_already_set();
}

inline void translate(const mpiml::Error& err) {
    const std::string what = err.what();
    const char* cls = "Error";
    if (err.mpi_code() != 0)
        cls = "MPIError";
    else if (what.find("no rank has any sample") != std::string::npos)
        cls = "NoSamplesError";
    else if (what.find("is not defined for element type") != std::string::npos)
        cls = "DtypeError";
    else if (what.find("finalized") == std::string::npos &&
             what.find("timed out") == std::string::npos)
        cls = "ArgumentError";
    py::object type = errors_module().attr(cls);
    py::object e = type(what);
    e.attr("call") = err.call();
    e.attr("rank") = err.rank();
    e.attr("mpi_code") = err.mpi_code();
    PyErr_SetObject(type.ptr(), e.ptr());
}

// ------------------------------------------------------------ MPI lifetime
inline std::atomic<bool> py_ready{false};

inline void ensure_initialized_py() {
    if (py_ready.load(std::memory_order_acquire)) return;
    static std::mutex m;
    std::lock_guard lock(m);
    if (py_ready.load()) return;
    if (!is_initialized()) {
        // The torch.distributed backend calls MPI from a worker thread.
        SessionOptions o;
        o.thread_level = MPI_THREAD_MULTIPLE;
        // Never destroyed: mpiml finalizes MPI at process exit (atexit).
        new Session(o);
    } else {
        ensure_initialized("mpiml");  // mpi4py (or another) initialized MPI: leave it to it
    }
    py_ready.store(true, std::memory_order_release);
}

/// call: the Python function that got c, for the error.
inline Comm to_comm(py::handle c, const char* call) {
    ensure_initialized_py();
    if (c.is_none()) return {};
    MPI_Fint f;
    py::object mpi = py::module_::import("sys").attr("modules").attr("get")("mpi4py.MPI");
    if (py::isinstance<py::bool_>(c))
        raise("ArgumentError", call, "comm must be None or an mpi4py communicator, got a bool");
    else if (py::isinstance<py::int_>(c))
        f = c.cast<MPI_Fint>();
    else if (py::hasattr(c, "py2f") && !mpi.is_none() && !py::isinstance(c, mpi.attr("Comm")))
        raise("ArgumentError", call, std::string("comm must be None or an mpi4py communicator, got mpi4py's ") +
                                            std::string(py::str(py::type::of(c).attr("__name__"))));
    else if (py::hasattr(c, "py2f"))
        f = c.attr("py2f")().cast<MPI_Fint>();
    else
        raise("ArgumentError", call, std::string("comm must be None or an mpi4py communicator, got ") +
                                            std::string(py::str(py::type::of(c).attr("__name__"))));
    const MPI_Comm comm = MPI_Comm_f2c(f);
    if (comm == MPI_COMM_NULL) raise("ArgumentError", call, "comm is MPI_COMM_NULL");
    return Comm(comm);
}

// ------------------------------------------------------------ call sites

/// The Python caller's frame (the first outside the mpiml package) as the
/// call site of the collectives run while it lives. Needs the GIL.
class PySite {
public:
    PySite() : mark_(caller()) {}

private:
    static detail::CallSite caller() {
        static const std::string package = [] {
            const auto file = py::module_::import("mpiml").attr("__file__").cast<std::string>();
            return file.substr(0, file.rfind('/') + 1);
        }();
        PyFrameObject* f = PyEval_GetFrame();  // borrowed
        Py_XINCREF(f);
        detail::CallSite site{};
        while (f) {
            PyCodeObject* code = PyFrame_GetCode(f);
            const char* file = PyUnicode_AsUTF8(code->co_filename);
            if (file && std::string_view(file).rfind(package, 0) != 0) {
                const char* name = PyUnicode_AsUTF8(code->co_name);
                site = {detail::profile_intern(file), static_cast<unsigned>(PyFrame_GetLineNumber(f)),
                        name ? detail::profile_intern(name) : nullptr};
                Py_DECREF(code);
                Py_DECREF(f);
                break;
            }
            Py_DECREF(code);
            PyFrameObject* back = PyFrame_GetBack(f);
            Py_DECREF(f);
            f = back;
        }
        PyErr_Clear();
        return site;
    }
    detail::SiteMark mark_;
};

}  // namespace mpiml::python
