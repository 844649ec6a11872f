// mpiml._torch: mpiml's LibTorch utilities for Python modules and tensors.
// Python's torch must be imported first (mpiml.mpi_pytorch does).
#include <mpiml/torch.hpp>

#include <torch/extension.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.hpp"

namespace {

using namespace mpiml::python;

PyObject* interned(const char* s) {
    return PyUnicode_InternFromString(s);  // called once per name (static below)
}

void add_unique(std::vector<at::Tensor>& out, std::vector<PyObject*>& seen, PyObject* t) {
    for (PyObject* s : seen)
        if (s == t) return;
    seen.push_back(t);
    out.push_back(THPVariable_Unpack(t));
}

// module.parameters() / module.buffers() order: modules in pre-order, each
// module's own dict in insertion order, duplicates (tied tensors) once.
void walk(PyObject* mod, PyObject* key, std::vector<PyObject*>& mods, std::vector<PyObject*>& seen,
          std::vector<at::Tensor>& out) {
    static PyObject* modules_key = interned("_modules");
    for (PyObject* m : mods)
        if (m == mod) return;
    mods.push_back(mod);
    py::object d = py::reinterpret_steal<py::object>(PyObject_GetAttr(mod, key));
    if (!d) throw py::error_already_set();
    if (!PyDict_Check(d.ptr())) throw py::type_error("module attribute is not a dict");
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d.ptr(), &pos, &k, &v)) {
        if (v == Py_None) continue;
        if (!THPVariable_Check(v)) throw py::type_error("module holds a non-tensor parameter or buffer");
        add_unique(out, seen, v);
    }
    py::object subs = py::reinterpret_steal<py::object>(PyObject_GetAttr(mod, modules_key));
    if (!subs) throw py::error_already_set();
    pos = 0;
    while (PyDict_Next(subs.ptr(), &pos, &k, &v))
        if (v != Py_None) walk(v, key, mods, seen, out);
}

bool is_plain_module(py::handle obj, const char* method) {
    static py::object module_type = py::module_::import("torch.nn").attr("Module");
    if (!PyObject_IsInstance(obj.ptr(), module_type.ptr())) return false;
    // A subclass that overrides parameters()/buffers() gets its own method called.
    py::object mine = py::type::of(obj).attr(method);
    py::object base = module_type.attr(method);
    return mine.is(base);
}

// The tensors of obj: an nn.Module's parameters (and buffers), or an iterable of tensors.
std::vector<at::Tensor> tensors_of(py::handle obj, bool params, bool buffers, const char* call) {
    static PyObject* params_key = interned("_parameters");
    static PyObject* buffers_key = interned("_buffers");
    std::vector<at::Tensor> out;
    std::vector<PyObject*> seen;
    if (is_plain_module(obj, params ? "parameters" : "buffers")) {
        if (params) {
            std::vector<PyObject*> mods;
            walk(obj.ptr(), params_key, mods, seen, out);
        }
        if (buffers) {
            std::vector<PyObject*> mods;
            walk(obj.ptr(), buffers_key, mods, seen, out);
        }
        return out;
    }
    auto add_iter = [&](py::handle it) {
        for (py::handle t : it) {
            if (!THPVariable_Check(t.ptr()))
                raise("DtypeError", call, std::string("expected tensors, got ") +
                                              std::string(py::str(py::type::of(t).attr("__name__"))));
            add_unique(out, seen, t.ptr());
        }
    };
    if (py::hasattr(obj, "parameters") && py::hasattr(obj, "buffers")) {  // Module overriding them
        if (params) add_iter(obj.attr("parameters")());
        if (buffers) add_iter(obj.attr("buffers")());
        return out;
    }
    if (THPVariable_Check(obj.ptr())) {
        out.push_back(THPVariable_Unpack(obj.ptr()));
        return out;
    }
    if (!py::isinstance<py::iterable>(obj))
        raise("ArgumentError", call, std::string("expected a torch.nn.Module or tensors, got ") +
                                         std::string(py::str(py::type::of(obj).attr("__name__"))));
    add_iter(obj);
    return out;
}

// The names of tensors_of(obj, true, buffers)'s tensors, from obj's
// named_parameters() (and named_buffers()), for the cross-rank checks'
// messages ("parameter '1.weight'", not "tensor '2'"); a list of tensors
// stays numbered. They name the list for the C++ calls on this thread while
// this lives.
struct NamesOf {
    std::vector<std::string> names;
    std::optional<mpiml::detail::TensorNames> scope;

    NamesOf(py::handle obj, const std::vector<at::Tensor>& ts, bool buffers) {
        if (!py::hasattr(obj, "named_parameters")) return;
        std::unordered_map<const void*, std::string> params, bufs;
        try {
            read(obj.attr("named_parameters")(), params);
            if (buffers && py::hasattr(obj, "named_buffers")) read(obj.attr("named_buffers")(), bufs);
        } catch (const py::error_already_set&) {  // not readable: numbered
            return;
        }
        std::size_t parameters = ts.size();
        for (std::size_t i = 0; i < ts.size(); ++i) {
            const void* key = ts[i].unsafeGetTensorImpl();
            if (auto p = params.find(key); p != params.end()) {
                names.push_back(p->second);
                continue;
            }
            parameters = std::min(parameters, i);
            auto b = bufs.find(key);
            names.push_back(b != bufs.end() ? b->second : std::to_string(i));
        }
        scope.emplace(names, parameters);
    }
    NamesOf(const NamesOf&) = delete;
    NamesOf& operator=(const NamesOf&) = delete;

private:
    static void read(py::handle items, std::unordered_map<const void*, std::string>& out) {
        for (py::handle item : items) {
            auto kv = py::reinterpret_borrow<py::tuple>(item);
            if (kv.size() == 2 && THPVariable_Check(kv[1].ptr()))
                out.emplace(THPVariable_Unpack(kv[1].ptr()).unsafeGetTensorImpl(), py::str(kv[0]));
        }
    }
};

// bucket_cap_mb of mpi_avg_grads and GradAverager, in bytes.
std::size_t cap_bytes(double mb, const char* call) {
    if (!(mb > 0) || mb * (1 << 20) > 1e15)
        raise("ArgumentError", call, "bucket_cap_mb must be positive, got " + std::to_string(mb));
    return static_cast<std::size_t>(mb * (1 << 20));
}

// GradAverager made from a torch.nn.Module: at each call the module's
// parameters are read again (the GIL held) and, when one was added, removed
// or replaced since, the call throws after its collectives. The module is
// held as a weak reference.
// Its destruction frees nothing collectively: Python destroys it when the
// last reference goes, or when the garbage collector finds it in a cycle, at
// a moment of its own on each rank. Its node-shared buckets are then kept:
// the next GradAverager made on the same ranks frees them once every rank
// has dropped it (else MPI_Finalize); close() frees them now (collective). The first base ends the
// deferral after GradAverager's destructor.
struct EndDeferral {
    std::optional<mpiml::detail::DeferFrees> deferral;
};
struct PyGradAverager : EndDeferral, mpiml::GradAverager {
    PyGradAverager(const std::vector<at::Tensor>& ts, const mpiml::AvgGradsOptions& o, const mpiml::Comm& c)
        : mpiml::GradAverager(ts, o, c), made(ts) {}
    ~PyGradAverager() { deferral.emplace(); }
    std::vector<at::Tensor> made;
    std::vector<std::string> made_names;  // parallel to made, or empty
    py::object module = py::none();  // a weakref, or None: tensors given, not a module

    std::string changed() const {
        if (module.is_none()) return {};
        try {
            py::object m = module();
            if (m.is_none()) return {};
            const auto now = tensors_of(m, true, false, "mpiml::GradAverager");
            std::string why = mpiml::detail::parameters_changed(made, now);
            if (why.empty()) return why;
            const NamesOf names(m, now, false);  // for the message
            return mpiml::detail::parameters_changed(made, now, made_names, names.names);
        } catch (const std::exception&) {  // the model cannot be read: not checked
            return {};
        }
    }
};

}  // namespace

PYBIND11_MODULE(_torch, m) {
    m.doc() = "mpiml LibTorch utilities (C++): use mpiml.mpi_pytorch";

    m.def("setup_pytorch_for_mpi", [] {
        ensure_initialized_py();
        py::gil_scoped_release nogil;
        mpiml::setup_pytorch_for_mpi();
    });
    // Each collective call takes the Python caller's frame as its call site (PySite).
    m.def("mpi_avg_grads", [](py::handle module, py::handle comm, double cap_mb, bool as_view) {
        PySite site;
        const mpiml::Comm c = to_comm(comm, "mpi_avg_grads");
        mpiml::AvgGradsOptions o;
        o.bucket_cap_bytes = cap_bytes(cap_mb, "mpi_avg_grads");
        auto ts = tensors_of(module, true, false, "mpi_avg_grads");
        o.gradient_as_bucket_view = as_view;
        std::optional<NamesOf> names;  // for the check's messages only
        if (mpiml::check_enabled()) names.emplace(module, ts, false);
        py::gil_scoped_release nogil;
        mpiml::mpi_avg_grads(ts, o, c);
    }, py::arg("module"), py::arg("comm") = py::none(), py::arg("bucket_cap_mb") = 25.0,
       py::arg("gradient_as_bucket_view") = false);
    // `with avg.no_sync():` holds a GradAverager::NoSync for the block.
    struct NoSyncContext {
        mpiml::GradAverager* avg;
        std::unique_ptr<mpiml::GradAverager::NoSync> guard;
    };
    py::class_<NoSyncContext>(m, "_NoSync")
        .def("__enter__", [](NoSyncContext& c) {
            c.guard = std::make_unique<mpiml::GradAverager::NoSync>(*c.avg);
        })
        .def("__exit__", [](NoSyncContext& c, py::args) {
            c.guard.reset();
            return false;
        });
    py::class_<PyGradAverager>(m, "GradAverager",
        "GradAverager(module, comm=None, gradient_as_bucket_view=False, bucket_cap_mb=25,\n"
        "             overlap=False, overlap_on_one_node=False)\n\n"
        "mpi_avg_grads for one model, holding its plan: the parameters (taken once, here),\n"
        "buckets and shared memory. avg() averages their gradients across ranks, as\n"
        "mpi_avg_grads(module, ...) does, without planning again. After changing the model\n"
        "(parameters added, removed or replaced, dtypes, sizes, requires_grad), make a new\n"
        "GradAverager: a call on a changed model raises ArgumentError after its collectives.\n"
        "Construction, each call and close() are collective over comm; dropping it frees\n"
        "nothing collectively (its node-shared buckets are freed by the next GradAverager\n"
        "made on the same ranks once every rank has dropped it, or at the program's end).\n"
        "overlap=True: buckets are averaged on a communication thread while backward() runs\n"
        "(reverse parameter order, as DDP); avg() finishes them. Accumulate several\n"
        "backward() passes under `with avg.no_sync():`. When every rank of comm is on one node,\n"
        "overlap=True averages in avg() (nothing can be hidden there: the averaging is\n"
        "memory-bound work on the cores backward() uses) unless overlap_on_one_node=True.")
        .def(py::init([](py::handle module, py::handle comm, bool as_view, double cap_mb,
                         bool overlap, bool one_node) {
                 PySite site;
                 const mpiml::Comm c = to_comm(comm, "GradAverager");
                 mpiml::AvgGradsOptions o;
                 o.bucket_cap_bytes = cap_bytes(cap_mb, "mpiml::GradAverager");
                 auto ts = tensors_of(module, true, false, "mpiml::GradAverager");
                 o.gradient_as_bucket_view = as_view;
                 o.overlap = overlap;
                 o.overlap_on_one_node = one_node;
                 std::unique_ptr<PyGradAverager> avg;
                 {
                     NamesOf names(module, ts, false);
                     {
                         py::gil_scoped_release nogil;
                         avg = std::make_unique<PyGradAverager>(ts, o, c);
                     }
                     avg->made_names = names.names;
                 }
                 if (py::hasattr(module, "parameters") && py::hasattr(module, "buffers")) {
                     try {
                         avg->module = py::weakref(module);
                     } catch (const std::exception&) {  // no weak references: not checked
                     }
                 }
                 return avg;
             }),
             py::arg("module"), py::arg("comm") = py::none(),
             py::arg("gradient_as_bucket_view") = false, py::arg("bucket_cap_mb") = 25.0,
             py::arg("overlap") = false, py::arg("overlap_on_one_node") = false)
        .def("__call__", [](PyGradAverager& a) {
            PySite site;
            const std::string changed = a.changed();
            {
                py::gil_scoped_release nogil;
                a();
            }
            if (!changed.empty()) mpiml::detail::fail("mpiml::GradAverager", changed);
        }, "Averages the gradients across ranks, in place (collective). Raises ArgumentError\n"
           "(after the collectives) when the module's parameters changed since: make a new\n"
           "GradAverager after changing the model.")
        .def("no_sync", [](PyGradAverager& a) { return NoSyncContext{&a, {}}; },
             py::keep_alive<0, 1>(),
             "Context manager: backward() passes inside only accumulate gradients; the\n"
             "call after the next backward() outside averages their sum.")
        .def("overlap_stats", [](const PyGradAverager& a) {
            const auto s = a.overlap_stats();
            py::dict d;
            d["steps"] = s.steps;
            d["buckets"] = s.buckets;
            d["averaging_s"] = s.averaging;
            d["hidden_s"] = s.hidden;
            d["left_s"] = s.left;
            return d;
        }, "With overlap=True: where this rank's averaging of the last step went, in seconds:\n"
           "{'steps', 'buckets', 'averaging_s' (the communication thread's time), 'hidden_s'\n"
           "(of that, before avg() was called), 'left_s' (avg()'s own wait)}. All zero\n"
           "without overlap (or with overlap on one node, see overlap_on_one_node) or with\n"
           "one rank.")
        .def("bucket_plan", &mpiml::GradAverager::bucket_plan,
             "With overlap=True: the buckets in the order they are averaged, each a list of\n"
             "positions in module.parameters(). Planned in reverse parameter order, rebuilt\n"
             "once at the first call in the order rank 0's gradients became final (the same\n"
             "plan on every rank). Empty without overlap (or on one node, see\n"
             "overlap_on_one_node) or with one rank.")
        .def("close", [](PyGradAverager& a) {
            PySite site;
            py::gil_scoped_release nogil;
            a.close();
        }, "Frees the plan and the node-shared buckets now (collective: every rank at the\n"
           "same point); the averager cannot be called after. Dropping the last reference\n"
           "frees nothing collectively (Python may do it at a different moment on each\n"
           "rank): the buckets are then freed by the next GradAverager made on the same\n"
           "ranks once every rank has dropped this one, or at the program's end.")
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](PyGradAverager& a, py::handle type, py::handle, py::handle) {
            if (!type.is_none()) return false;  // a failure: the other ranks are elsewhere
            PySite site;
            {
                py::gil_scoped_release nogil;
                a.close();
            }
            return false;
        }, "Leaving a `with GradAverager(...) as avg:` block calls close() (not when an\n"
           "exception leaves it: the other ranks may not be there).")
        .def("__len__", &mpiml::GradAverager::size, "Parameters whose gradients are averaged.");
    m.def("sync_params", [](py::handle module, int root, py::handle comm) {
        PySite site;
        const mpiml::Comm c = to_comm(comm, "sync_params");
        auto ts = tensors_of(module, true, true, "sync_params");
        NamesOf names(module, ts, true);
        py::gil_scoped_release nogil;
        mpiml::sync_params(ts, root, c);
    }, py::arg("module"), py::arg("root") = 0, py::arg("comm") = py::none());
    // Benchmark hook: k calls of the C++ API on the same tensors, in a C++ loop.
    m.def("_bench_avg_grads", [](py::handle module, int k) {
        auto ts = tensors_of(module, true, false, "mpi_avg_grads");
        py::gil_scoped_release nogil;
        for (int i = 0; i < k; ++i) mpiml::mpi_avg_grads(ts);
    });
    m.def("mpi_avg", [](const at::Tensor& x, py::handle comm) {
        const mpiml::Comm c = to_comm(comm, "mpi_avg");
        py::gil_scoped_release nogil;
        return mpiml::mpi_avg(x, c);
    }, py::arg("x"), py::arg("comm") = py::none());
}
