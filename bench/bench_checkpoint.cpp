// Checkpoint save against one plain write() + fsync() of the same bytes, in
// the same run, interleaved (the order rotates each round); medians over
// rounds. The state: ResNet-50-sized parameters with Adam's two moments
// (25.6M float32 each, 307 MB), as shared state (rank 0 writes it).
// ratio_to_plain (_4mib): the median over rounds of the variant's time over
// the plain (4 MiB) write's in the same round.
//   save       Checkpointer::save of the bytes as views (put_view; keep=1:
//              the previous checkpoint is renamed aside and deleted in the
//              background, finished before the next variant starts, as a
//              run's training between saves would let it)
//   put+save   the same, counting the copies into a StateMap kept from one
//              save to the next (its buffers are reused)
//   put+save (fresh)  the same into a new StateMap each time (new memory)
//   torch      the same tensors through the LibTorch codec (torch::save into
//              the kept StateMap's memory), then save [with mpiml::torch]
//   plain      rank 0: open, one write() of the 307 MB, fsync, close
//   plain (4 MiB writes)  the same in 4 MiB write()s, as the save writes
//
//   mpirun -np 1 bench_checkpoint [--dir=/tmp/mpiml_bench_ckpt] [--params=25600000]
//          [--rounds=5] [--json=FILE]
#include <mpiml/mpiml.hpp>
#ifdef MPIML_BENCH_TORCH
#include <mpiml/torch.hpp>

#include <torch/torch.h>
#endif

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

void plain_write(const fs::path& p, const std::vector<std::string>& parts, std::size_t chunk) {
    // One contiguous buffer, written at most `chunk` bytes per write().
    static std::string all;
    if (all.empty())
        for (const auto& s : parts) all += s;
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) std::perror("open"), std::exit(1);
    std::size_t done = 0;
    while (done < all.size()) {
        const ssize_t r = ::write(fd, all.data() + done, std::min(chunk, all.size() - done));
        if (r <= 0) std::perror("write"), std::exit(1);
        done += static_cast<std::size_t>(r);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) std::perror("fsync"), std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    std::string dir = "/tmp/mpiml_bench_ckpt", json;
    long params = 25'600'000;
    int rounds = 5;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a.rfind("--dir=", 0) == 0) dir = a.substr(6);
        else if (a.rfind("--params=", 0) == 0) params = std::stol(a.substr(9));
        else if (a.rfind("--rounds=", 0) == 0) rounds = std::stoi(a.substr(9));
        else if (a.rfind("--json=", 0) == 0) json = a.substr(7);
        else {
            std::fprintf(stderr, "bench_checkpoint: unknown argument %s\n", a.c_str());
            return 2;
        }
    }
    const int rank = mpiml::proc_id();
    if (rank == 0) {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    mpiml::barrier();

    // Parameters and Adam's exp_avg / exp_avg_sq: arbitrary, incompressible-ish floats.
    std::vector<std::string> parts(3, std::string(static_cast<std::size_t>(params) * 4, '\0'));
    std::uint32_t x = 12345;
    for (auto& s : parts)
        for (std::size_t i = 0; i < s.size(); i += 4) {
            x = x * 1664525u + 1013904223u;
            std::memcpy(&s[i], &x, 4);
        }
    const char* names[3] = {"params", "exp_avg", "exp_avg_sq"};
    std::size_t bytes = 0;
    for (const auto& s : parts) bytes += s.size();

    mpiml::Checkpointer ck(fs::path(dir) / "ckpt", {.keep = 1});
    mpiml::CheckpointState ready;
    for (int i = 0; i < 3; ++i) ready.shared.put_view(names[i], parts[i]);
    ready.per_rank.put("rank", rank);
    std::int64_t step = 0;

    struct Variant {
        std::string name;
        std::function<void()> fn;
        std::vector<double> t;
    };
    std::vector<Variant> vs;
    vs.push_back({"plain", [&] {
                      if (rank == 0) plain_write(fs::path(dir) / "plain.bin", parts, parts[0].size() * 3);
                  }, {}});
    vs.push_back({"plain (4 MiB writes)", [&] {
                      if (rank == 0) plain_write(fs::path(dir) / "plain.bin", parts, 4 << 20);
                  }, {}});
    vs.push_back({"save", [&] { ck.save(++step, ready); }, {}});
    mpiml::CheckpointState kept;
    vs.push_back({"put+save", [&] {
                      for (int i = 0; i < 3; ++i) kept.shared.put_bytes(names[i], parts[i]);
                      kept.per_rank.put("rank", rank);
                      ck.save(++step, kept);
                  }, {}});
    vs.push_back({"put+save (fresh)", [&] {
                      mpiml::CheckpointState st;
                      for (int i = 0; i < 3; ++i) st.shared.put_bytes(names[i], parts[i]);
                      st.per_rank.put("rank", rank);
                      ck.save(++step, st);
                  }, {}});
#ifdef MPIML_BENCH_TORCH
    std::vector<torch::Tensor> tensors;
    for (auto& s : parts)
        tensors.push_back(torch::from_blob(s.data(), {params}, torch::kFloat32));
    mpiml::CheckpointState kept_torch;
    vs.push_back({"torch", [&] {
                      for (int i = 0; i < 3; ++i)
                          kept_torch.shared.put(names[i], tensors[static_cast<std::size_t>(i)]);
                      kept_torch.per_rank.put("rank", rank);
                      ck.save(++step, kept_torch);
                  }, {}});
#endif

    for (int r = 0; r < rounds + 1; ++r) {  // round 0: warm-up, not counted
        for (std::size_t k = 0; k < vs.size(); ++k) {
            Variant& v = vs[(k + static_cast<std::size_t>(r)) % vs.size()];
            // Between saves a run trains: the previous deletions are done.
            mpiml::Checkpointer::wait_for_removals();
            mpiml::barrier();
            if (rank == 0) {
                fs::remove(fs::path(dir) / "plain.bin");
                ::sync();
            }
            mpiml::barrier();
            const double t0 = now();
            v.fn();
            mpiml::barrier();
            const double t = now() - t0;
            if (r > 0) v.t.push_back(t);
        }
    }

    if (rank == 0) {
        std::string out;
        for (const auto& v : vs) {
            // Paired: each round's time over the same round's plain writes.
            std::vector<double> ratio, ratio4;
            for (std::size_t i = 0; i < v.t.size(); ++i) {
                ratio.push_back(v.t[i] / vs[0].t[i]);
                ratio4.push_back(v.t[i] / vs[1].t[i]);
            }
            char line[512];
            std::snprintf(line, sizeof line,
                          "{\"bench\": \"checkpoint\", \"variant\": \"%s\", \"ranks\": %d, \"bytes\": %zu, "
                          "\"median_s\": %.4f, \"min_s\": %.4f, \"ratio_to_plain\": %.3f, "
                          "\"ratio_to_plain_4mib\": %.3f, \"rounds\": %d}\n",
                          v.name.c_str(), mpiml::num_procs(), bytes, median(v.t),
                          *std::min_element(v.t.begin(), v.t.end()), median(ratio), median(ratio4), rounds);
            out += line;
        }
        std::fputs(out.c_str(), stdout);
        if (!json.empty())
            if (FILE* f = std::fopen(json.c_str(), "w")) std::fputs(out.c_str(), f), std::fclose(f);
        mpiml::Checkpointer::wait_for_removals();
        fs::remove_all(dir);
    }
    return 0;
}
