// The LibTorch layer's shared parts: the dtype table, the cross-rank module
// check and the module's tensors.
#include "torch/common.hpp"

#include "core/agreement.hpp"
#include "core/report.hpp"

#include <mpiml/error.hpp>

#include <algorithm>
#include <sstream>
#include <unordered_set>

namespace mpiml::torch_detail {

// ------------------------------------------------------------ dtype table

std::string dtype_name(at::ScalarType s) {
    const TorchDtype* d = torch_dtype(s);
    return d ? d->name : c10::toString(s);
}

namespace {
Wire wire_of(const TorchDtype& d) {
    return {d.elem->type, d.elem->cls, d.scalar, d.elem->size};
}
}  // namespace

std::optional<Wire> sum_wire(at::ScalarType s) {
    const TorchDtype* d = torch_dtype(s);
    if (!d || d->kind == 0) return std::nullopt;
    if (!has_gradients(s)) return wire_of(*torch_dtype(at::kDouble));  // integers and bool
    // Floating and complex: in their own kind, at least float32 / complex64
    // wide (16-bit floats are summed in float32), where the gradient kernels
    // (with_grad_dtype) have a wire for them.
    const std::size_t least = d->kind == 'c' ? 8 : 4;
    const TorchDtype* w = torch_dtype_of(detail::reduced_in(d->kind, std::max(d->size, least)));
    if (!w || !with_grad_dtype(s, []<class W, class T>() {})) return std::nullopt;
    return wire_of(*w);
}

bool has_gradients(at::ScalarType s) {
    return at::isFloatingType(s) || at::isComplexType(s);
}

/// MPI type and element multiplier for broadcasting dtype s (bit copy).
std::pair<MPI_Datatype, std::size_t> bcast_type(at::ScalarType s) {
    const TorchDtype* d = torch_dtype(s);
    if (d && d->elem) return {d->elem->type, 1};
    return {MPI_BYTE, c10::elementSize(s)};
}

/// True when t's elements can be read and written as a plain array of dtype s.
bool plain(const at::Tensor& t, at::ScalarType s) {
    return t.defined() && t.layout() == at::kStrided && t.is_cpu() && t.scalar_type() == s &&
           t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

void bump_version(c10::TensorImpl* t) {
    if (!t->is_inference()) t->bump_version();
}
void bump_version(const at::Tensor& t) { bump_version(t.unsafeGetTensorImpl()); }

at::Tensor wire_view(void* data, at::IntArrayRef sizes, at::ScalarType wire) {
    return at::from_blob(data, sizes, at::TensorOptions().dtype(wire));
}


// ------------------------------------------------ cross-rank module check

/// One line per tensor: what must agree across ranks.
std::string describe(const char* kind, const std::string& name, const at::Tensor& t) {
    std::ostringstream os;
    os << kind << " '" << name << "' " << dtype_name(t.scalar_type()) << '[';
    for (std::size_t i = 0; i < t.sizes().size(); ++i) os << (i ? ", " : "") << t.sizes()[i];
    os << ']';
    if (t.layout() != at::kStrided) os << ' ' << t.layout();
    if (!t.device().is_cpu()) os << " on " << t.device();
    return os.str();
}

/// describe(), plus whether gradients are averaged for it.
std::string describe_grad(const char* kind, const std::string& name, const at::Tensor& t) {
    return describe(kind, name, t) + (t.requires_grad() ? "" : " (no grad)");
}

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

std::uint64_t hash_desc(const std::string& d) {
    return fnv1a(d.data(), d.size(), fnv_basis) | 1u;  // never 0: 0 means "absent"
}

/// Verifies that every rank passed the same descriptions (and root, when
/// root >= 0), in one small allreduce. On a mismatch, exchanges details and
/// throws the same mpiml::Error on every rank, naming the first differing
/// entry and the ranks that differ from the reference rank.
[[noreturn]] void report_mismatch(const std::vector<std::uint64_t>& hashes,
                                  const std::function<std::string(std::size_t)>& desc_of,
                                  const std::int64_t (&header)[2], int root, MPI_Comm comm,
                                  const char* call);

void verify_same(const std::vector<std::uint64_t>& hashes,
                 const std::function<std::string(std::size_t)>& desc_of, int root, MPI_Comm comm,
                 const char* call) {
    std::uint64_t h = fnv_basis;
    const std::int64_t header[2] = {root, static_cast<std::int64_t>(hashes.size())};
    h = fnv1a(header, sizeof header, h);
    for (const std::uint64_t dh : hashes) h = fnv1a(&dh, sizeof dh, h);
    if (detail::agree(reinterpret_cast<const std::int64_t*>(&h), 1, comm, call)) return;
    report_mismatch(hashes, desc_of, header, root, comm, call);
}

/// Every rank's description of entry `i` (padded exchange), by rank.
std::vector<std::string> gather_descriptions(const std::string& own, MPI_Comm comm,
                                             const char* call) {
    const auto usize = static_cast<std::size_t>(num_procs(comm));
    const std::uint64_t len = own.size();
    std::vector<std::uint64_t> lens(usize);
    detail::allgather(&len, lens.data(), 1, MPI_UINT64_T, comm, call);
    const std::size_t width = *std::max_element(lens.begin(), lens.end());
    std::string padded = own;
    padded.resize(width, '\0');
    std::string texts(width * usize, '\0');
    detail::allgather(padded.data(), texts.data(), width, MPI_CHAR, comm, call);
    std::vector<std::string> has(usize);
    for (std::size_t r = 0; r < usize; ++r) has[r] = texts.substr(r * width, lens[r]);
    return has;
}

/// The slow path, only on a mismatch: every rank learns every rank's details
/// and throws the same error.
void report_mismatch(const std::vector<std::uint64_t>& hashes,
                     const std::function<std::string(std::size_t)>& desc_of,
                     const std::int64_t (&header)[2], int root, MPI_Comm comm, const char* call) {
    const int size = num_procs(comm);
    const auto usize = static_cast<std::size_t>(size);
    std::vector<std::int64_t> heads(2 * usize);
    detail::allgather(header, heads.data(), 2, MPI_INT64_T, comm, call);

    bool roots_agree = true;
    for (int r = 0; r < size; ++r) roots_agree &= heads[2 * r] == heads[0];
    if (!roots_agree) {
        std::string what = "ranks disagree on the root:";
        for (int r = 0; r < size; ++r)
            what += std::string(r ? "," : "") + " rank " + std::to_string(r) + " passed " +
                    std::to_string(heads[2 * r]);
        detail::fail(call, what);
    }
    const int ref = (root >= 0 && root < size) ? root : 0;

    std::size_t most = 0;
    for (int r = 0; r < size; ++r) most = std::max<std::size_t>(most, heads[2 * r + 1]);
    std::vector<std::uint64_t> mine(most, 0), all(most * usize);
    for (std::size_t i = 0; i < hashes.size(); ++i) mine[i] = hashes[i];
    if (most > 0) detail::allgather(mine.data(), all.data(), most, MPI_UINT64_T, comm, call);

    std::size_t first = most;
    for (std::size_t i = 0; i < most && first == most; ++i)
        for (int r = 0; r < size; ++r)
            if (all[r * most + i] != all[static_cast<std::size_t>(ref) * most + i]) {
                first = i;
                break;
            }
    if (first == most) detail::fail(call, "modules differ across ranks (hash mismatch)");

    const std::vector<std::string> has = gather_descriptions(
        first < hashes.size() ? desc_of(first)
                              : "nothing (only " + std::to_string(hashes.size()) + " parameters and buffers)",
        comm, call);
    std::vector<int> differ;
    for (int r = 0; r < size; ++r)
        if (has[r] != has[ref]) differ.push_back(r);

    // The same message on every rank: entry, its name, who differs, who has what.
    std::string name;
    for (int r : [&] { std::vector<int> o{ref}; o.insert(o.end(), differ.begin(), differ.end()); return o; }()) {
        const auto q = has[r].find('\'');
        if (q == std::string::npos || has[r].rfind("nothing", 0) == 0) continue;
        name = has[r].substr(q, has[r].find('\'', q + 1) - q + 1);
        break;
    }
    std::string what = "modules differ across ranks at entry #" + std::to_string(first) +
                       (name.empty() ? "" : " " + name) + ": " + detail::rank_list(differ) +
                       (differ.size() == 1 ? " differs" : " differ") + " from rank " +
                       std::to_string(ref) + ": " + detail::group_ranks(has, ref, "has", "have");
    detail::fail(call, what + called_from(ref, comm, call));
}

/// " (rank 0 called at a.cpp:3; rank 1 called at b.cpp:9)": where each rank
/// called from, empty when no rank knows (collective).
std::string called_from(int ref, MPI_Comm comm, const char* call) {
    std::vector<std::string> sites =
        gather_descriptions(detail::site_text(detail::current_site()), comm, call);
    if (std::none_of(sites.begin(), sites.end(), [](const std::string& s) { return !s.empty(); }))
        return {};
    for (std::string& s : sites)
        if (s.empty()) s = "an unknown place";
    return " (" + detail::group_ranks(sites, ref, "called at", "called at") + ")";
}

void verify_same_settings(const Setting* settings, int n, const char* what, MPI_Comm comm,
                          const char* call) {
    std::vector<std::int64_t> mine(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) mine[i] = settings[i].value;
    if (detail::agree(mine.data(), n, comm, call)) return;
    const int size = num_procs(comm);
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(size));
    detail::allgather(mine.data(), all.data(), mine.size(), MPI_INT64_T, comm, call);
    auto every_rank_true = [&](int j) {
        for (int r = 0; r < size; ++r)
            if (all[static_cast<std::size_t>(r) * n + j] != 1) return false;
        return true;
    };
    std::string text;
    for (int i = 0; i < n; ++i) {
        const Setting& s = settings[i];
        if (s.only_if >= 0 && !every_rank_true(s.only_if)) continue;
        std::vector<std::string> has(static_cast<std::size_t>(size));
        bool differ = false;
        for (int r = 0; r < size; ++r) {
            const std::int64_t v = all[static_cast<std::size_t>(r) * n + i];
            has[r] = s.flag ? (v ? "true" : "false") : std::to_string(static_cast<std::uint64_t>(v));
            differ = differ || v != all[i];
        }
        if (differ)
            text += (text.empty() ? "" : "; and on ") + std::string(what) + "." + s.name + ": " +
                    detail::group_ranks(has, 0, "has", "have");
    }
    detail::fail(call, "ranks disagree on " + text + called_from(0, comm, call));
}

void verify_same(const std::vector<std::string>& descs, int root, MPI_Comm comm,
                 const char* call) {
    std::vector<std::uint64_t> hashes;
    hashes.reserve(descs.size());
    for (const auto& d : descs) hashes.push_back(hash_desc(d));
    verify_same(hashes, [&](std::size_t i) { return descs[i]; }, root, comm, call);
}

// ------------------------------------------------------------ collection


/// Appends the defined tensors of `dict` not seen before (tied weights once).
void add_unique(std::vector<Named>& out, std::unordered_set<const void*>& seen,
                const torch::OrderedDict<std::string, at::Tensor>& dict, const char* kind) {
    for (const auto& item : dict) {
        const at::Tensor& t = item.value();
        if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second)
            out.push_back({kind, item.key(), t});
    }
}

std::vector<Named> module_entries(const torch::nn::Module& module, bool with_buffers) {
    std::vector<Named> out;
    std::unordered_set<const void*> seen;
    add_unique(out, seen, module.named_parameters(true), "parameter");
    if (with_buffers) add_unique(out, seen, module.named_buffers(true), "buffer");
    return out;
}

/// A module's own registered parameters, read without copying: parameters_
/// is protected, so its member pointer is named through a derived class.
struct ParamAccess : torch::nn::Module {
    static const torch::OrderedDict<std::string, at::Tensor>& of(const torch::nn::Module& m) {
        return m.*(&ParamAccess::parameters_);
    }
};

/// module.parameters(true) in the same order (pre-order, registration order),
/// without building the names: this is the hot path of mpi_avg_grads.
void collect_params(const torch::nn::Module& m, std::vector<at::Tensor>& out) {
    for (const auto& item : ParamAccess::of(m))
        if (item.value().defined()) out.push_back(item.value());
    for (const auto& child : m.children()) collect_params(*child, out);
}

}  // namespace mpiml::torch_detail

namespace mpiml::detail {
namespace {
thread_local const TensorNames* innermost_names = nullptr;
}  // namespace

TensorNames::TensorNames(const std::vector<std::string>& names, std::size_t parameters) noexcept
    : names(names), parameters(parameters), outer_(innermost_names) {
    innermost_names = this;
}

TensorNames::~TensorNames() { innermost_names = outer_; }

const TensorNames* TensorNames::current() noexcept { return innermost_names; }

}  // namespace mpiml::detail

namespace mpiml::torch_detail {

Named list_name(std::size_t i, const at::Tensor& t) {
    const detail::TensorNames* n = detail::TensorNames::current();
    if (n && i < n->names.size()) return {i < n->parameters ? "parameter" : "buffer", n->names[i], t};
    return {"tensor", std::to_string(i), t};
}

std::vector<Named> list_entries(const std::vector<torch::Tensor>& tensors, const char* what) {
    std::vector<Named> out;
    out.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (!tensors[i].defined())
            detail::fail(what, "tensor " + std::to_string(i) + " is undefined");
        out.push_back(list_name(i, tensors[i]));
    }
    return out;
}

}  // namespace mpiml::torch_detail
