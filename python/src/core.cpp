// mpiml._core: the core library for Python (numpy arrays zero-copy through
// the buffer protocol; every collective goes through mpiml's C++ core).
#include <mpiml/mpiml.hpp>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <complex>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.hpp"
#include "core/op.hpp"     // src/: the registry of ops
#include "core/state.hpp"  // other_mpi_library, begin_foreign_init
#include "core/types.hpp"  // and of element types

namespace py = pybind11;

namespace mpiml::detail {
void exit_guard_run(bool exiting);  // src/core/exit_guard.hpp (libmpiml, not installed)
void exit_guard_unstarted(bool exiting);
}

// Python's own dumper of every thread's frames (faulthandler's; no GIL needed).
extern "C" const char* _Py_DumpTracebackThreads(int fd, PyInterpreterState* interp,
                                                PyThreadState* current_tstate);

namespace {

using namespace mpiml;
using namespace mpiml::python;

// ------------------------------------------------------------ Python stacks in reports
PyInterpreterState* python_interp = nullptr;

std::string read_fd(int fd) {
    std::string text;
    char buf[8192];
    ::lseek(fd, 0, SEEK_SET);
    for (ssize_t k; (k = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(k));
    return text;
}

// Drops the block of one thread ("Thread 0x... (most recent call first):" and
// its frames) from a dump.
std::string without_thread(const std::string& dump, unsigned long id) {
    char tag[40];
    std::snprintf(tag, sizeof tag, "hread 0x%016lx", id);
    std::string out;
    bool skipping = false;
    std::size_t at = 0;
    while (at < dump.size()) {
        std::size_t end = dump.find('\n', at);
        end = end == std::string::npos ? dump.size() : end + 1;
        const std::string_view line(dump.data() + at, end - at);
        if (line.rfind("Thread 0x", 0) == 0 || line.rfind("Current thread 0x", 0) == 0)
            skipping = line.find(tag) != std::string_view::npos;
        if (!skipping) out.append(line);
        at = end;
    }
    return out;
}

// Every Python thread's frames for a report. Other threads push and pop
// frames while they run, so they are read with the GIL held, taken by a
// thread of its own; when that does not succeed within a second, the GIL's
// holder runs C code and holds it (no frame can change meanwhile), and they
// are read without it, as faulthandler does.
void dump_python_stacks(int fd) {
    if (!python_interp || !Py_IsInitialized() || _Py_IsFinalizing()) return;
    struct Job {
        std::mutex m;
        std::condition_variable cv;
        bool done = false;
        std::string text;
    };
    auto job = std::make_shared<Job>();
    try {
        std::thread([job] {
            const int own = ::memfd_create("mpiml-python-stacks-gil", MFD_CLOEXEC);
            std::string text;
            if (own >= 0 && Py_IsInitialized() && !_Py_IsFinalizing()) {
                const PyGILState_STATE g = PyGILState_Ensure();
                _Py_DumpTracebackThreads(own, python_interp, nullptr);
                PyGILState_Release(g);
                text = without_thread(read_fd(own), static_cast<unsigned long>(::pthread_self()));
            }
            if (own >= 0) ::close(own);
            std::lock_guard lock(job->m);
            job->text = std::move(text);
            job->done = true;
            job->cv.notify_all();
        }).detach();
    } catch (const std::system_error&) {
        _Py_DumpTracebackThreads(fd, python_interp, nullptr);
        return;
    }
    std::unique_lock lock(job->m);
    if (job->cv.wait_for(lock, std::chrono::seconds(1), [&] { return job->done; })) {
        for (std::size_t at = 0; at < job->text.size();) {
            const ssize_t k = ::write(fd, job->text.data() + at, job->text.size() - at);
            if (k <= 0) break;
            at += static_cast<std::size_t>(k);
        }
        return;
    }
    lock.unlock();
    _Py_DumpTracebackThreads(fd, python_interp, nullptr);
}

// ------------------------------------------------------------ dtypes
using detail::TypeInfo;

PyArray_Descr* descr(const py::array& a) {
    return PyArray_DESCR(reinterpret_cast<PyArrayObject*>(a.ptr()));
}

// The registry's element type of a numpy dtype: the same kind and size.
const TypeInfo& elem_of(const py::array& a, const char* call) {
    const PyArray_Descr* d = descr(a);
    if (d->byteorder == '>')
        raise("DtypeError", call, "big-endian arrays are not supported; use .astype(its native dtype)");
    if (const TypeInfo* e = detail::find_kind(d->kind, static_cast<std::size_t>(d->elsize))) return *e;
    raise("DtypeError", call,
          "dtype " + std::string(py::str(a.dtype().attr("name"))) + " has no MPI datatype (use " +
              detail::kind_names() + ")");
}

std::string dtype_str(const py::array& a) { return py::str(a.dtype().attr("name")); }

bool contiguous(const py::array& a) {
    return (a.flags() & (py::array::c_style | py::array::f_style)) != 0;
}

void check_buffer(const py::array& a, const char* call, const char* what, bool writable) {
    if (!contiguous(a))
        raise("ArgumentError", call,
              std::string(what) + " is not contiguous; pass np.ascontiguousarray(...) (a copy)");
    if (writable && !a.writeable()) raise("ArgumentError", call, std::string(what) + " is read-only");
}

ReduceOp to_op(py::handle op, const char* call) {
    if (py::isinstance<py::str>(op)) {
        const auto s = op.cast<std::string>();
        if (const Op* o = detail::op_by_name(s.c_str())) return *o;
        raise("ArgumentError", call, "unknown op '" + s + "' (use " + detail::op_names() + ")");
    }
    if (py::hasattr(op, "py2f")) {  // mpi4py's MPI.Op
        const MPI_Op o = MPI_Op_f2c(op.attr("py2f")().cast<MPI_Fint>());
        if (o == MPI_OP_NULL) raise("ArgumentError", call, "op is MPI.OP_NULL");
        return o;
    }
    raise("ArgumentError", call, "op must be an op name ('sum', 'max', ...) or an mpi4py MPI.Op, got " +
                                     std::string(py::str(py::type::of(op).attr("__name__"))));
}

// allreduce(send or None (in place), recv, op, comm)
void py_allreduce(py::handle send_h, py::array recv, py::handle op_h, py::handle comm_h) {
    PySite site;
    static const char* call = "allreduce";
    const Comm comm = to_comm(comm_h, call);
    const ReduceOp op = to_op(op_h, call);
    check_buffer(recv, call, "recvbuf", true);
    const TypeInfo& e = elem_of(recv, call);
    const void* send = MPI_IN_PLACE;
    py::array sa;
    if (!send_h.is_none()) {
        if (!py::isinstance<py::array>(send_h))
            raise("ArgumentError", call, "sendbuf must be a numpy array or IN_PLACE");
        sa = py::reinterpret_borrow<py::array>(send_h);
        check_buffer(sa, call, "sendbuf", false);
        if (!sa.dtype().is(recv.dtype()))
            raise("DtypeError", call, "sendbuf has dtype " + dtype_str(sa) +
                                          " but recvbuf has " + dtype_str(recv));
        if (sa.size() != recv.size())
            raise("ArgumentError", call, "sendbuf has " + std::to_string(sa.size()) +
                                             " elements but recvbuf has " + std::to_string(recv.size()));
        send = sa.data();
    }
    void* out = recv.mutable_data();
    const MPI_Comm c = comm.get(call);
    py::gil_scoped_release nogil;
    detail::allreduce(send, out, static_cast<std::size_t>(recv.size()), e.type, e.cls, op, c, call);
}

// A new array: op over ranks of x (same dtype); with avg, the sum divided by
// the number of ranks (integers and bool as float64).
// The logical and bitwise ops (those not defined for floating types) keep bool
// arrays bool, as numpy's do; the others count True as 1.
bool is_logical(const ReduceOp& op) {
    const auto k = op.known();
    return k && !detail::op_allowed(*k, TypeClass::floating);
}

// x as an array without a copy when it is one; anything else through numpy's conversion.
py::array as_array(py::handle x, const char* call) {
    if (PyArray_Check(x.ptr())) return py::reinterpret_borrow<py::array>(x);
    if (!PyFloat_Check(x.ptr()) && !PyLong_Check(x.ptr()) && !PyList_Check(x.ptr()) &&
        !PyTuple_Check(x.ptr()) && !PyArray_IsScalar(x.ptr(), Generic)) {
        // Other objects (CPU tensors, ...): mpiml.mpi_tools._array (zero-copy for tensors).
        static py::object* conv = new py::object(py::module_::import("mpiml.mpi_tools").attr("_array"));
        py::object a = (*conv)(x, call);
        if (!PyArray_Check(a.ptr())) throw py::type_error("mpiml: conversion did not give an array");
        return py::reinterpret_borrow<py::array>(a);
    }
    PyObject* a = PyArray_FromAny(x.ptr(), nullptr, 0, 0, 0, nullptr);
    if (!a) throw py::error_already_set();
    return py::reinterpret_steal<py::array>(a);
}

py::object numpy_scalar(double v, int npy_type);

py::object py_reduce(py::handle x_h, py::handle op_h, bool avg, py::handle comm_h, const char* call) {
    PySite site;
    if (PyFloat_CheckExact(x_h.ptr())) {  // the common case (PPO's KL): no array at all
        const Comm comm = to_comm(comm_h, call);
        const ReduceOp op = avg ? ReduceOp(Op::sum) : to_op(op_h, call);
        const double v = PyFloat_AS_DOUBLE(x_h.ptr());
        double out = 0.0;
        const MPI_Comm c = comm.get(call);
        {
            py::gil_scoped_release nogil;
            detail::allreduce(&v, &out, 1, MPI_DOUBLE, TypeClass::floating, op, c, call);
            if (avg) {
                int size = 1;
                MPI_Comm_size(c, &size);
                out /= size;
            }
        }
        return numpy_scalar(out, NPY_DOUBLE);
    }
    // np.isscalar(x), as the seed: Python and numpy scalars give a numpy scalar.
    const bool scalar = PyArray_IsAnyScalar(x_h.ptr());
    py::array x = as_array(x_h, call);
    const Comm comm = to_comm(comm_h, call);
    ReduceOp op = avg ? ReduceOp(Op::sum) : to_op(op_h, call);
    const char kind = descr(x)->kind;
    const auto esize = static_cast<std::size_t>(descr(x)->elsize);
    if (!detail::find_kind(kind, esize)) {  // float16: reduced in float32
        if (const TypeInfo* w = detail::reduced_in(kind, esize)) {
            const std::string wide = std::string(1, kind) + std::to_string(w->size);
            py::object r = py_reduce(x.attr("astype")(wide), op_h, avg, comm_h, call);
            r = r.attr("astype")(x.dtype());
            return scalar ? py::object(r[py::tuple()]) : r;
        }
    }
    if (!avg && kind == 'b') {
        if (!is_logical(op))  // True counts 1, as numpy's sum
            x = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(x);
        else if (!detail::op_allowed(*op.known(), TypeClass::logical))  // band on bool is land
            op = detail::op_on_bool(*op.known());
    }
    const TypeInfo* e = &elem_of(x, call);
    if (avg && (e->cls == TypeClass::integer || e->cls == TypeClass::logical)) {
        x = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(x);
        e = &elem_of(x, call);
    }
    if (!(x.flags() & py::array::c_style)) x = py::array::ensure(x, py::array::c_style);
    PyObject* o_raw = PyArray_NewLikeArray(reinterpret_cast<PyArrayObject*>(x.ptr()), NPY_CORDER, nullptr, 0);
    if (!o_raw) throw py::error_already_set();
    auto out = py::reinterpret_steal<py::array>(o_raw);
    const MPI_Comm c = comm.get(call);
    const auto n = static_cast<std::size_t>(x.size());
    void* o = out.mutable_data();
    {
        py::gil_scoped_release nogil;
        detail::allreduce(x.data(), o, n, e->type, e->cls, op, c, call);
        if (avg) {
            int size = 1;
            MPI_Comm_size(c, &size);
            detail::with_elem<void>(*e, [&]<class E>(E) {
                using T = typename E::type;
                if constexpr (E::cls == TypeClass::floating || E::cls == TypeClass::complex) {
                    using R = decltype(std::abs(T{}));  // complex: divided by a real
                    auto* p = static_cast<T*>(o);
                    for (std::size_t i = 0; i < n; ++i) p[i] /= static_cast<R>(size);
                }
            });
        }
    }
    if (scalar) return py::reinterpret_steal<py::object>(PyArray_Return(reinterpret_cast<PyArrayObject*>(out.release().ptr())));
    return out;
}

py::object numpy_scalar(double v, int npy_type) {
    if (npy_type == NPY_FLOAT) {
        const float f = static_cast<float>(v);
        return py::reinterpret_steal<py::object>(PyArray_Scalar(const_cast<float*>(&f), PyArray_DescrFromType(NPY_FLOAT), nullptr));
    }
    return py::reinterpret_steal<py::object>(PyArray_Scalar(&v, PyArray_DescrFromType(NPY_DOUBLE), nullptr));
}

// mpi_statistics_scalar: one collective through the C++ core.
py::tuple py_statistics(py::handle x_h, bool with_min_and_max, py::handle comm_h) {
    PySite site;
    static const char* call = "mpi_statistics_scalar";
    py::array x = as_array(x_h, call);
    const Comm comm = to_comm(comm_h, call);
    int out_type = NPY_DOUBLE;
    if (!(x.flags() & py::array::c_style)) x = py::array::ensure(x, py::array::c_style);
    const auto n = static_cast<std::size_t>(x.size());
    const MPI_Comm c = comm.get(call);
    Statistics s;
    std::uint64_t bits = 64;  // the widest samples of any rank: float32 only where every rank's are
    const char kind = descr(x)->kind;
    if (kind == 'f' && descr(x)->elsize == 4 && descr(x)->byteorder != '>') {
        const auto* p = static_cast<const float*>(x.data());
        py::gil_scoped_release nogil;
        s = detail::reduce_moments(detail::local_moments(p, n), c, call, &bits);
    } else {
        if (!(kind == 'f' || kind == 'i' || kind == 'u' || kind == 'b'))
            raise("DtypeError", call, "samples must be real numbers, got dtype " + dtype_str(x));
        py::array_t<double, py::array::c_style | py::array::forcecast> d =
            py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(x);
        const double* p = d.data();
        py::gil_scoped_release nogil;
        s = detail::reduce_moments(detail::local_moments(p, n), c, call, &bits);
    }
    if (bits == 32) out_type = NPY_FLOAT;
    if (with_min_and_max)
        return py::make_tuple(numpy_scalar(s.mean, out_type), numpy_scalar(s.std, out_type),
                              numpy_scalar(s.min, out_type), numpy_scalar(s.max, out_type));
    return py::make_tuple(numpy_scalar(s.mean, out_type), numpy_scalar(s.std, out_type));
}

void py_broadcast(py::handle x_h, int root, py::handle comm_h) {
    PySite site;
    static const char* call = "broadcast";
    const Comm comm = to_comm(comm_h, call);
    if (!py::isinstance<py::array>(x_h))
        raise("ArgumentError", call, std::string("x must be a numpy array (broadcast is in place), got ") +
                                         std::string(py::str(py::type::of(x_h).attr("__name__"))));
    auto x = py::reinterpret_borrow<py::array>(x_h);
    check_buffer(x, call, "x", true);
    const TypeInfo& e = elem_of(x, call);
    void* p = x.mutable_data();
    const MPI_Comm c = comm.get(call);
    py::gil_scoped_release nogil;
    detail::broadcast(p, static_cast<std::size_t>(x.size()), e.type, root, c, call);
}

// The Region context manager's state.
class PyRegion {
public:
    explicit PyRegion(std::string name) : name_(std::move(name)) {}
    void enter() {
        // MPIML_PROFILE starts profiling when MPI is initialized: a region
        // opened before the first collective initializes it.
        static const bool from_env = detail::env_profile_requested();
        if (from_env) ensure_initialized_py();
        if (profiling()) r_ = std::make_unique<Region>(name_);
    }
    void exit() { r_.reset(); }

private:
    std::string name_;
    std::unique_ptr<Region> r_;
};

int thread_level_now() {
    int p = -1;
    if (is_initialized() && !is_finalized()) MPI_Query_thread(&p);
    return p;
}

}  // namespace

// mpi_avg and mpi_sum, called every step (PPO's KL and episode statistics),
// as METH_FASTCALL functions: the same arguments and errors as through
// pybind11, without its per-call dispatch (argument vectors, overload loop).
template <bool Avg>
PyObject* fast_reduce(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const char* call = Avg ? "mpi_avg" : "mpi_sum";
    try {
        PyObject* slot[2] = {nullptr, Py_None};
        static const char* const names[2] = {"x", "comm"};
        if (nargs > 2) {
            PyErr_Format(PyExc_TypeError, "%s() takes at most 2 arguments (%zd given)", call, nargs);
            return nullptr;
        }
        for (Py_ssize_t i = 0; i < nargs; ++i) slot[i] = args[i];
        const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
        for (Py_ssize_t k = 0; k < nkw; ++k) {
            PyObject* key = PyTuple_GET_ITEM(kwnames, k);
            int at = -1;
            for (int j = 0; j < 2; ++j)
                if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0) at = j;
            if (at < 0) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", call, key);
                return nullptr;
            }
            if (at < nargs) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", call, names[at]);
                return nullptr;
            }
            slot[at] = args[nargs + k];
        }
        if (!slot[0]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument 'x'", call);
            return nullptr;
        }
        static py::object* sum = new py::object(py::str("sum"));  // never destroyed
        py::object r = py_reduce(slot[0], Avg ? py::none() : *sum, Avg, slot[1], call);
        // As the seed's mpi_avg (mpi_sum(x) / num_procs()): a 0-d array in, a
        // numpy scalar out (a float for json, hashing, isinstance).
        if (Avg && PyArray_Check(r.ptr()) && PyArray_NDIM(reinterpret_cast<PyArrayObject*>(r.ptr())) == 0)
            return PyArray_Return(reinterpret_cast<PyArrayObject*>(r.release().ptr()));
        return r.release().ptr();
    } catch (py::error_already_set& e) {
        e.restore();
    } catch (const mpiml::Error& e) {
        translate(e);
    } catch (const py::builtin_exception& e) {
        e.set_error();
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return nullptr;
}

namespace mpiml::python {
void register_checkpoint(py::module_& m);  // checkpoint.cpp
}

PYBIND11_MODULE(_core, m) {
    m.doc() = "mpiml core (C++): use mpiml.mpi_tools";
    if (_import_array() < 0) throw py::error_already_set();
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const mpiml::Error& e) {
            translate(e);
        }
    });

    mpiml::python::register_checkpoint(m);

    // Reports of where every rank is show this interpreter's Python stacks.
    python_interp = PyInterpreterState_Get();
    detail::set_python_stacks(dump_python_stacks);
    // (at interpreter exit, before its threads' states go: mpiml.runtime)
    m.def("_forget_python_stacks", [] { detail::set_python_stacks(nullptr); });
    // The mark of a launched rank's process (failure.cpp), set in the C
    // environment as mpiml loaded: for os.environ too (mpiml.runtime).
    m.def("_rank_process_mark", []() -> py::object {
        const char* v = std::getenv("MPIML_RANK_PROCESS");
        return v ? py::object(py::str(v)) : py::object(py::none());
    });
    // What a report shows of this interpreter (tests): with the GIL released,
    // as the report agent finds it, or held (the dumper then waits a second).
    m.def("_python_stacks", [](bool release_gil) {
        const int fd = ::memfd_create("mpiml-python-stacks-test", MFD_CLOEXEC);
        if (fd < 0) throw std::runtime_error("memfd_create failed");
        if (release_gil) {
            py::gil_scoped_release nogil;
            dump_python_stacks(fd);
        } else {
            dump_python_stacks(fd);
        }
        std::string text = read_fd(fd);
        ::close(fd);
        return text;
    }, py::arg("release_gil") = true);
    m.def("report", [](const std::string& reason) {
        ensure_initialized_py();
        py::gil_scoped_release nogil;
        return report(reason);
    }, py::arg("reason") = "requested by the program",
       "Prints where every rank is (rank 0's stderr and MPIML_REPORT_DIR); returns the text.");

    m.def("init", &ensure_initialized_py, "Initializes MPI (THREAD_MULTIPLE) unless already initialized.");
    m.def("_other_mpi_library", [] { return detail::other_mpi_library(); });
    // Around mpi4py's import, which starts MPI: watched as mpiml's own start.
    m.def("_begin_foreign_init", [] { detail::begin_foreign_init(); });
    m.def("_end_foreign_init", [] { detail::end_foreign_init(); });
    m.def("is_initialized", [] { return is_initialized(); });
    m.def("is_finalized", [] { return is_finalized(); });
    m.def("thread_level", &thread_level_now);
    m.def("finalize", [] { finalize(); });
    // (rank, size) of MPI_COMM_WORLD if MPI is running, else None; never initializes.
    m.def("world", []() -> py::object {
        if (!is_initialized() || is_finalized()) return py::none();
        int r = 0, n = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        MPI_Comm_size(MPI_COMM_WORLD, &n);
        return py::make_tuple(r, n);
    });
    m.def("proc_id", [](py::handle comm) { return proc_id(to_comm(comm, "proc_id")); }, py::arg("comm") = py::none());
    m.def("num_procs", [](py::handle comm) { return num_procs(to_comm(comm, "num_procs")); }, py::arg("comm") = py::none());
    m.attr("EXIT_STOPPED") = exit_stopped;
    m.def("stop_on_signals", [](const std::vector<int>& signals) { stop_on_signals(signals); });
    m.def("stop_requested", [] { return stop_requested(); });
    m.def("stop_signal", [] { return stop_signal(); });
    m.def("should_stop", [](py::handle comm) {
        PySite site;
        const Comm c = to_comm(comm, "should_stop");
        py::gil_scoped_release nogil;
        return should_stop(c);
    }, py::arg("comm") = py::none());
    m.def("barrier", [](py::handle comm) {
        PySite site;
        const Comm c = to_comm(comm, "barrier");
        py::gil_scoped_release nogil;
        barrier(c);
    }, py::arg("comm") = py::none());

    m.def("allreduce", &py_allreduce, py::arg("sendbuf"), py::arg("recvbuf"), py::arg("op"),
          py::arg("comm"));
    // The registry's reduce ops and element types, as numpy sees them.
    m.def("op_names", [] {
        std::vector<std::string> names;
        for (Op o : all_ops) names.emplace_back(op_name(o));
        return names;
    });
    // numpy dtype name -> the registry's name of its element type (derived by kind and size).
    m.def("element_types", [] {
        py::dict out;
        const auto np = py::module_::import("numpy");
        for (std::int64_t id = 0; const TypeInfo* e = detail::type_by_id(id); ++id) {
            if (e->kind == 0) continue;
            const py::object dt = np.attr("dtype")(std::string(1, e->kind) + std::to_string(e->size));
            const auto name = py::str(dt.attr("name"));
            if (!out.contains(name)) out[name] = e->name;
        }
        return out;
    });
    // The seed's mpi_op / mpi_sum / mpi_avg / mpi_statistics_scalar, bound
    // directly as mpiml.mpi_tools' functions (no Python layer per call).
    m.def("reduce", [](py::handle x, py::handle op, py::handle comm) {
        return py_reduce(x, op, false, comm, "mpi_op");
    });
    m.def("mpi_op", [](py::handle x, py::handle op, py::handle comm) {
        return py_reduce(x, op, false, comm, "mpi_op");
    }, py::arg("x"), py::arg("op"), py::arg("comm") = py::none(),
       "op over ranks of a scalar (-> numpy scalar) or array-like (-> new numpy array of the\n"
       "same shape and dtype). op: 'sum', 'max', ... or an mpi4py MPI.Op.");
    static PyMethodDef fast[] = {
        {"mpi_sum", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_reduce<false>)),
         METH_FASTCALL | METH_KEYWORDS, "mpi_sum(x, comm=None)\n\nSum of a scalar or array-like over ranks."},
        {"mpi_avg", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_reduce<true>)),
         METH_FASTCALL | METH_KEYWORDS,
         "mpi_avg(x, comm=None)\n\nAverage of a scalar or array-like over ranks (dtype kept; "
         "integers and bool: float64)."},
        {nullptr, nullptr, 0, nullptr}};
    if (PyModule_AddFunctions(m.ptr(), fast) < 0) throw py::error_already_set();
    m.def("avg", [](py::handle x, py::handle comm) {
        return py_reduce(x, py::none(), true, comm, "mpi_avg");
    });
    m.def("statistics", &py_statistics);
    m.def("mpi_statistics_scalar", &py_statistics, py::arg("x"),
          py::arg("with_min_and_max") = false, py::arg("comm") = py::none(),
          "(mean, std) or (mean, std, min, max) of all ranks' samples pooled (population\n"
          "std), in one collective. Raises NoSamplesError on every rank when no rank has a\n"
          "sample.");
    m.def("broadcast", &py_broadcast);

    m.def("set_timeout", [](double s) { ensure_initialized_py(); set_timeout(s); });
    m.def("timeout", [] { ensure_initialized_py(); return timeout(); });
    m.def("set_check", [](bool on) { ensure_initialized_py(); set_check(on); });
    m.def("check_enabled", [] { ensure_initialized_py(); return check_enabled(); });
    m.def("_env_profile_requested", &detail::env_profile_requested,
          "MPIML_PROFILE asks for a profile (read with every variable, in config.cpp)");

    m.def("profile_start", [](std::string dir) { ensure_initialized_py(); profile_start(std::move(dir)); });
    m.def("profile_stop", [] { ensure_initialized_py(); profile_stop(); });
    m.def("profiling", [] { return profiling(); });
    m.def("profile_dir", [] { return profile_dir(); });
    py::class_<PyRegion>(m, "Region")
        .def(py::init<std::string>())
        .def("enter", &PyRegion::enter)
        .def("exit", &PyRegion::exit);

    m.def("abort_job", [](const std::string& what, int code) {
        std::fflush(nullptr);
        abort_job(what, code);
    });
    m.def("install_failure_handlers", [] { install_failure_handlers(); });
    // The exit guard of MPI_Finalize, run early: a Python exit handler that
    // needs collectives calls it first (returns once every rank has ended;
    // aborts the job if a peer waits in a collective this rank never entered).
    m.def("_exit_guard", [] {
        py::gil_scoped_release nogil;
        detail::exit_guard_run(true);
    });
    // At interpreter exit: what the teardown destroys (a GradAverager's
    // shared buckets) is freed by MPI_Finalize, after the exit guard, not
    // collectively on the way (a peer may still wait in a collective).
    m.def("_defer_collective_frees", [] { detail::defer_collective_frees(); });
    m.def("_shared_buckets", [] { return detail::shared_bucket_count(); },
          "The node-shared buckets alive in this process (for tests).");
    // At interpreter exit when mpi4py (or another library) started MPI and
    // this process made no mpiml call: ranks waiting in their first
    // collective learn that this one ended.
    m.def("_exit_guard_unstarted", [] {
        py::gil_scoped_release nogil;
        detail::exit_guard_unstarted(true);
    });

    // Benchmark hooks: k calls of the C++ API in a C++ loop (bench/peers/mpiml_peer.py
    // times them beside the Python calls, in the same process).
    m.def("_bench_statistics", [](py::array_t<float, py::array::c_style> x, bool mm, int k) {
        std::span<const float> v(x.data(), static_cast<std::size_t>(x.size()));
        double sink = 0;
        py::gil_scoped_release nogil;
        for (int i = 0; i < k; ++i) sink += mpi_statistics_scalar(v, mm).std;
        return sink;
    });
    m.def("_bench_avg_scalar", [](double x, int k) {
        double sink = 0;
        py::gil_scoped_release nogil;
        for (int i = 0; i < k; ++i) sink += mpi_avg(x);
        return sink;
    });
    m.def("_bench_avg_vector", [](py::array_t<float, py::array::c_style> x, int k) {
        std::span<const float> v(x.data(), static_cast<std::size_t>(x.size()));
        double sink = 0;
        py::gil_scoped_release nogil;
        for (int i = 0; i < k; ++i) sink += mpi_avg(v)[0];
        return sink;
    });

    // The C++ launcher's plan: (launcher argv, environment), bytes, byte-exact.
    // user: NAME=value settings the program made, kept where the plan's
    // filter of an MPI runtime's variables dropped them.
    auto with_user = [](detail::LaunchPlan plan, const std::vector<std::string>& user) {
        for (const auto& kv : user) {
            const auto name = kv.substr(0, kv.find('=') + 1);
            if (std::none_of(plan.env.begin(), plan.env.end(),
                             [&](const std::string& e) { return e.rfind(name, 0) == 0; }))
                plan.env.push_back(kv);
        }
        return plan;
    };
    m.def("plan_fork", [with_user](int n, bool bind_to_core, const std::vector<std::string>& user) {
        const auto plan = with_user(detail::plan_fork(n, bind_to_core), user);
        py::list argv, env;
        for (const auto& a : plan.argv) argv.append(py::bytes(a));
        for (const auto& e : plan.env) env.append(py::bytes(e));
        return py::make_tuple(argv, env);
    }, py::arg("n"), py::arg("bind_to_core"), py::arg("user") = std::vector<std::string>{});
    // mpi_fork with restarts: program is the command line to run on n ranks.
    m.def("run_with_restarts", [with_user](int n, bool bind_to_core, const std::vector<std::string>& program,
                                           int restarts, double backoff, const std::vector<std::string>& user) {
        const auto plan = with_user(detail::plan_program(n, bind_to_core, program), user);
        py::gil_scoped_release nogil;
        return detail::run_with_restarts(plan, restarts, backoff, "mpi_fork");
    }, py::arg("n"), py::arg("bind_to_core"), py::arg("program"), py::arg("restarts"),
       py::arg("backoff"), py::arg("user") = std::vector<std::string>{});
    // mpi_fork without restarts: runs program on n ranks once, returns the job's status.
    m.def("run_once", [with_user](int n, bool bind_to_core, const std::vector<std::string>& program,
                                  const std::vector<std::string>& user) {
        const auto plan = with_user(detail::plan_program(n, bind_to_core, program), user);
        py::gil_scoped_release nogil;
        return detail::run_once(plan, "mpi_fork");
    }, py::arg("n"), py::arg("bind_to_core"), py::arg("program"),
       py::arg("user") = std::vector<std::string>{});
    m.def("started_by_launcher", [] { return detail::started_by_launcher(); });
    m.def("restart_attempt", [] { return restart_attempt(); },
          "0 on a job's first run, k on its k-th restart (MPIML_ATTEMPT)");
}
