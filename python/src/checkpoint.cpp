// mpiml._core's checkpoint functions: the C++ mpiml::Checkpointer with
// entries as (name, kind, bytes); mpiml/checkpoint.py encodes Python values.
#include "common.hpp"

#include <pybind11/stl.h>

#include <climits>
#include <deque>
#include <string>

namespace mpiml::python {
namespace {

void raise_checkpoint_error(const CheckpointError& e) {
    py::object type = errors_module().attr("CheckpointError");
    py::object x = type(std::string(e.what()));
    x.attr("call") = e.call();
    x.attr("rank") = e.rank();
    x.attr("mpi_code") = e.mpi_code();
    x.attr("path") = e.path();
    if (e.error_code() != 0) x.attr("errno") = e.error_code();
    PyErr_SetObject(type.ptr(), x.ptr());
}

/// Buffers of Python objects held for the duration of a save.
class Buffers {
public:
    Buffers() = default;
    Buffers(const Buffers&) = delete;
    Buffers& operator=(const Buffers&) = delete;
    ~Buffers() {  // with the GIL held
        for (auto& b : views_) PyBuffer_Release(&b);
    }
    std::string_view get(py::handle obj) {
        views_.emplace_back();
        if (PyObject_GetBuffer(obj.ptr(), &views_.back(), PyBUF_SIMPLE) != 0) {
            views_.pop_back();
            throw py::error_already_set();
        }
        const Py_buffer& b = views_.back();
        return {static_cast<const char*>(b.buf), static_cast<std::size_t>(b.len)};
    }

private:
    std::deque<Py_buffer> views_;
};

/// [(name, kind, bytes-like or list of them), ...] -> StateMap of views into
/// the objects' buffers.
StateMap to_map(py::handle entries, Buffers& buffers, const char* call) {
    StateMap map;
    for (py::handle item : entries) {
        auto t = py::reinterpret_borrow<py::tuple>(item);
        if (t.size() != 3) raise("ArgumentError", call, "an entry is not (name, kind, data)");
        const auto name = t[0].cast<std::string>();
        const auto kind = t[1].cast<std::string>();
        std::vector<std::string_view> pieces;
        if (py::isinstance<py::list>(t[2]))
            for (py::handle piece : t[2]) pieces.push_back(buffers.get(piece));
        else
            pieces.push_back(buffers.get(t[2]));
        map.put_view(name, std::move(pieces), kind);
    }
    return map;
}

py::list from_map(StateMap& map) {
    py::list out;
    for (const auto& [name, e] : map.entries())
        out.append(py::make_tuple(name, e.kind, py::bytes(e.data.data(), e.data.size())));
    map.clear();
    return out;
}

/// Agrees whether any rank failed to encode its values; raises on every rank
/// if one did (no rank is left waiting in the save).
void agree_encoded(const std::string& error, MPI_Comm comm, const char* call) {
    int bad = error.empty() ? INT_MAX : proc_id(comm);
    int first = INT_MAX;
    {
        py::gil_scoped_release unlocked;
        allreduce(bad, first, Op::min, comm);
    }
    if (first == INT_MAX) return;
    std::string text = proc_id(comm) == first ? error : std::string();
    {
        py::gil_scoped_release unlocked;
        broadcast(text, first, comm);
    }
    raise("ArgumentError", call, "rank " + std::to_string(first) + ": " + text);
}

}  // namespace

void register_checkpoint(py::module_& m) {
    // Tried before the general mpiml::Error translator (registered earlier).
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const CheckpointError& e) {
            raise_checkpoint_error(e);
        }
    });

    m.def(
        "checkpoint_save",
        [](const std::string& dir, std::int64_t step, py::handle shared, py::handle per_rank,
           const std::map<std::string, std::string>& metadata, int keep, py::handle comm,
           const std::string& encode_error) {
            const char* call = "save_checkpoint";
            const Comm c = to_comm(comm, call);
            agree_encoded(encode_error, c.get(call), call);
            Buffers buffers;  // released after the save, with the GIL
            CheckpointState st;
            st.shared = to_map(shared, buffers, call);
            st.per_rank = to_map(per_rank, buffers, call);
            st.metadata = metadata;
            Checkpointer ck(dir, {.keep = keep, .comm = c});
            py::gil_scoped_release unlocked;
            ck.save(step, st);
        },
        py::arg("dir"), py::arg("step"), py::arg("shared"), py::arg("per_rank"), py::arg("metadata"),
        py::arg("keep"), py::arg("comm"), py::arg("encode_error"));

    m.def(
        "checkpoint_load",
        [](const std::string& dir, std::optional<std::int64_t> step, py::handle comm) -> py::object {
            const Comm c = to_comm(comm, "load_checkpoint");
            Checkpointer ck(dir, {.comm = c});
            CheckpointState st;
            std::optional<CheckpointInfo> info;
            {
                py::gil_scoped_release unlocked;
                info = step ? ck.load(*step, st) : ck.load_latest(st);
            }
            if (!info) return py::none();
            py::list skipped;
            for (const auto& s : info->skipped) skipped.append(s);
            return py::make_tuple(info->step, info->world_size, info->path.string(), from_map(st.shared),
                                  from_map(st.per_rank), st.metadata, skipped);
        },
        py::arg("dir"), py::arg("step"), py::arg("comm"));

    m.def("checkpoint_wait_for_removals", [] {
        py::gil_scoped_release unlocked;
        Checkpointer::wait_for_removals();
    });
    m.def("checkpoint_steps", [](const std::string& dir) { return Checkpointer(dir).steps(); },
          py::arg("dir"));
}

}  // namespace mpiml::python
