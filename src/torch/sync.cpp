// sync_params: broadcast a module's parameters and buffers from a root rank,
// after verifying every rank has the same ones.
#include "torch/common.hpp"

#include <mpiml/error.hpp>

#include <algorithm>
#include <cstring>
#include <unordered_set>

namespace mpiml {
using namespace torch_detail;
namespace {

// ------------------------------------------------------------ sync_params

// Tensors of at least this many bytes are broadcast on their own, in place
// when contiguous; smaller ones are packed into buckets of at most kSyncBucket
// bytes. Both depend on shapes and dtypes only, which every rank has verified
// equal, so every rank issues the same broadcasts.
constexpr std::size_t kSyncDirect = std::size_t{256} << 10;
constexpr std::size_t kSyncBucket = std::size_t{4} << 20;

/// hash_desc(describe(kind, name, t)) without building the string.
std::uint64_t hash_entry(const Named& e) {
    std::uint64_t h = fnv1a(e.kind, std::strlen(e.kind), fnv_basis);
    h = fnv1a(e.name.data(), e.name.size(), h);
    const std::int64_t meta[4] = {static_cast<std::int64_t>(e.tensor.scalar_type()),
                                  static_cast<std::int64_t>(e.tensor.layout()), e.tensor.dim(),
                                  static_cast<std::int64_t>(e.tensor.device().type())};
    h = fnv1a(meta, sizeof meta, h);
    const auto sz = e.tensor.sizes();
    h = fnv1a(sz.data(), sz.size() * sizeof(std::int64_t), h);
    return h | 1u;
}

void sync_entries(const std::vector<Named>& entries, int root, MPI_Comm comm) {
    constexpr const char* call = "mpiml::sync_params";
    std::vector<std::uint64_t> hashes;
    hashes.reserve(entries.size());
    for (const auto& e : entries) hashes.push_back(hash_entry(e));
    verify_same(hashes, [&](std::size_t i) { return describe(entries[i].kind, entries[i].name, entries[i].tensor); },
                root, comm, call);  // throws on every rank or on none

    // From here on every rank has the same dtypes and shapes, so every check
    // below fails on all ranks or on none.
    const int size = num_procs(comm);
    if (root < 0 || root >= size)
        detail::fail(call, "root " + std::to_string(root) + " is not a rank of a communicator "
                           "of size " + std::to_string(size));
    for (const auto& e : entries)
        if (e.tensor.layout() != at::kStrided || e.tensor.is_quantized())
            detail::fail(call, e.kind + std::string(" '") + e.name +
                                   "' is not a dense tensor; only dense tensors can be synced");
    for (const auto& e : entries)
        if (!e.tensor.device().is_cpu())
            detail::fail(call, e.kind + std::string(" '") + e.name + "' is on " + e.tensor.device().str() +
                                   "; only CPU tensors can be synced (move the module to the CPU first)");
    if (size == 1) return;
    const bool is_root = proc_id(comm) == root;

    torch::NoGradGuard no_grad;
    std::vector<at::ScalarType> order;  // dtypes in first-appearance order
    for (const auto& e : entries)
        if (std::find(order.begin(), order.end(), e.tensor.scalar_type()) == order.end())
            order.push_back(e.tensor.scalar_type());

    thread_local Scratch scratch;
    for (const at::ScalarType s : order) {
        const auto [type, mult] = bcast_type(s);
        const std::size_t esize = c10::elementSize(s);
        std::vector<const at::Tensor*> bucket;
        std::size_t bucket_bytes = 0;
        auto flush = [&] {
            if (bucket.empty()) return;
            auto* buf = static_cast<std::byte*>(scratch.get(bucket_bytes));
            std::size_t off = 0;
            if (is_root)
                for (const at::Tensor* t : bucket) {
                    const std::size_t nb = static_cast<std::size_t>(t->numel()) * esize;
                    if (plain(*t, s)) std::memcpy(buf + off, t->data_ptr(), nb);
                    else wire_view(buf + off, t->sizes(), s).copy_(*t);
                    off += nb;
                }
            detail::broadcast(buf, bucket_bytes / esize * mult, type, root, comm, call);
            if (!is_root)
                for (const at::Tensor* t : bucket) {
                    const std::size_t nb = static_cast<std::size_t>(t->numel()) * esize;
                    if (plain(*t, s)) std::memcpy(t->data_ptr(), buf + off, nb);
                    else t->copy_(wire_view(buf + off, t->sizes(), s));
                    bump_version(*t);
                    off += nb;
                }
            bucket.clear();
            bucket_bytes = 0;
        };
        for (const auto& e : entries) {
            const at::Tensor& t = e.tensor;
            if (t.scalar_type() != s || t.numel() == 0) continue;
            const std::size_t nb = static_cast<std::size_t>(t.numel()) * esize;
            if (nb >= kSyncDirect) {
                if (plain(t, s)) {
                    detail::broadcast(t.data_ptr(), nb / esize * mult, type, root, comm, call);
                    if (!is_root) bump_version(t);
                } else {  // staged alone, through a contiguous copy
                    at::Tensor tmp = at::empty(t.sizes(), at::TensorOptions().dtype(s));
                    if (is_root) tmp.copy_(t);
                    detail::broadcast(tmp.data_ptr(), nb / esize * mult, type, root, comm, call);
                    if (!is_root) {
                        t.copy_(tmp);
                        bump_version(t);
                    }
                }
                continue;
            }
            if (bucket_bytes + nb > kSyncBucket) flush();
            bucket.push_back(&t);
            bucket_bytes += nb;
        }
        flush();
    }
}

}  // namespace

void sync_params(torch::nn::Module& module, int root, Comm comm, std::source_location loc) {
    detail::SiteMark site(loc);
    sync_entries(module_entries(module, /*with_buffers=*/true), root, comm.get("mpiml::sync_params"));
}

void sync_params(const torch::Tensor& tensor, int root, Comm comm, std::source_location loc) {
    sync_params(std::vector<torch::Tensor>{tensor}, root, comm, loc);
}

void sync_params(const std::vector<torch::Tensor>& tensors, int root, Comm comm,
                 std::source_location loc) {
    detail::SiteMark site(loc);
    std::vector<Named> entries = list_entries(tensors, "mpiml::sync_params");
    std::unordered_set<const void*> seen;
    std::erase_if(entries,
                  [&](const Named& e) { return !seen.insert(e.tensor.unsafeGetTensorImpl()).second; });
    sync_entries(entries, root, comm.get("mpiml::sync_params"));
}

}  // namespace mpiml
