// mpiml._core: the core library for Python.
#include <mpiml/mpiml.hpp>

#include <pybind11/pybind11.h>

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
    m.doc() = "mpiml core (C++)";
    m.def("proc_id", [] { return mpiml::proc_id(); });
    m.def("num_procs", [] { return mpiml::num_procs(); });
}
