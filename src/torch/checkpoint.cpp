// LibTorch state in checkpoints: torch::save / torch::load through memory.
#include <mpiml/torch.hpp>

#include <torch/serialize.h>

namespace mpiml::detail {
namespace {

/// Appends what an archive writes to out.
std::function<std::size_t(const void*, std::size_t)> append_to(std::string& out) {
    out.clear();
    return [&out](const void* p, std::size_t n) {
        out.append(static_cast<const char*>(p), n);
        return n;
    };
}

torch::serialize::InputArchive read_archive(std::string_view in) {
    torch::serialize::InputArchive a;
    a.load_from(in.data(), in.size());
    return a;
}

}  // namespace

void checkpoint_encode(const torch::nn::Module& m, std::string& out) {
    torch::serialize::OutputArchive a;
    m.save(a);
    std::size_t bytes = 0;
    for (const auto& t : m.parameters()) bytes += t.nbytes();
    for (const auto& t : m.buffers()) bytes += t.nbytes();
    out.reserve(bytes + (64u << 10));
    a.save_to(append_to(out));
}

void checkpoint_decode(std::string_view in, torch::nn::Module& m) {
    auto a = read_archive(in);
    m.load(a);
}

void checkpoint_encode(const torch::optim::Optimizer& o, std::string& out) {
    torch::serialize::OutputArchive a;
    o.save(a);
    std::size_t bytes = 0;
    for (const auto& g : o.param_groups())
        for (const auto& t : g.params()) bytes += 2 * t.nbytes();  // Adam: two moments
    out.reserve(bytes + (64u << 10));
    a.save_to(append_to(out));
}

void checkpoint_decode(std::string_view in, torch::optim::Optimizer& o) {
    auto a = read_archive(in);
    o.load(a);
}

void checkpoint_encode(const torch::Tensor& t, std::string& out) {
    out.reserve((t.defined() ? t.nbytes() : 0) + (16u << 10));
    torch::save(t, append_to(out));
}

void checkpoint_decode(std::string_view in, torch::Tensor& t) {
    torch::Tensor loaded;
    torch::load(loaded, in.data(), in.size());
    t = loaded;
}

void checkpoint_encode(const std::vector<torch::Tensor>& ts, std::string& out) {
    std::size_t bytes = 0;
    for (const auto& t : ts) bytes += t.defined() ? t.nbytes() : 0;
    out.reserve(bytes + (16u << 10) * (ts.size() + 1));
    torch::save(ts, append_to(out));
}

void checkpoint_decode(std::string_view in, std::vector<torch::Tensor>& ts) {
    std::vector<torch::Tensor> loaded;
    torch::load(loaded, in.data(), in.size());
    ts = std::move(loaded);
}

void checkpoint_encode(const at::Generator& g, std::string& out) {
    at::Generator gen = g;  // shares the implementation
    torch::Tensor state;
    {
        std::lock_guard<std::mutex> lock(gen.mutex());
        state = gen.get_state();
    }
    checkpoint_encode(state, out);
}

void checkpoint_decode(std::string_view in, at::Generator& g) {
    torch::Tensor state;
    checkpoint_decode(in, state);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
}

}  // namespace mpiml::detail
