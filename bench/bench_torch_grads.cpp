// mpi_avg_grads and sync_params against their peers, in the same run, on
// Spinning Up's MLP actor-critic (observation 17, action 6, tanh MLPs for the
// Gaussian policy mean and the value function, plus log_std).
//
//   mpirun -np 2 bench_torch_grads [--samples N] [--hidden 64,64]...
//                                  [--bucket-cap BYTES] [--json FILE]
//
// Peers, all on the same gradients / parameters:
//   grads: mpiml::mpi_avg_grads | per-parameter MPI_Allreduce + divide (the
//          seed's approach) | ONE MPI_Allreduce of a flat float32 buffer of the
//          same total size (no packing, no divide: the floor)
//   sync:  mpiml::sync_params | per-tensor MPI_Bcast | ONE MPI_Bcast of a flat
//          buffer of the same size
// Each figure: quantiles over N single calls of the slowest rank's time, each
// call after a barrier; methods are interleaved call by call.
#include <mpiml/mpiml.hpp>
#include <mpiml/torch.hpp>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/version.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

// ------------------------------------------------------------------ model

torch::nn::Sequential mlp(const std::vector<int64_t>& sizes) {
    torch::nn::Sequential s;
    for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
        s->push_back(torch::nn::Linear(sizes[i], sizes[i + 1]));
        if (i + 2 < sizes.size()) s->push_back(torch::nn::Tanh());
    }
    return s;
}

/// Spinning Up's MLPActorCritic with a Gaussian actor.
struct ActorCriticImpl : torch::nn::Module {
    ActorCriticImpl(int64_t obs, int64_t act, const std::vector<int64_t>& hidden) {
        std::vector<int64_t> pi_sizes{obs}, v_sizes{obs};
        pi_sizes.insert(pi_sizes.end(), hidden.begin(), hidden.end());
        v_sizes.insert(v_sizes.end(), hidden.begin(), hidden.end());
        pi_sizes.push_back(act);
        v_sizes.push_back(1);
        log_std = register_parameter("log_std", torch::full({act}, -0.5));
        mu_net = register_module("mu_net", mlp(pi_sizes));
        v_net = register_module("v_net", mlp(v_sizes));
    }
    torch::Tensor log_std;
    torch::nn::Sequential mu_net{nullptr}, v_net{nullptr};
};
TORCH_MODULE(ActorCritic);

// ------------------------------------------------------------------ timing

struct Options {
    int samples = 2000;
    std::vector<std::vector<int64_t>> hidden;
    std::size_t bucket_cap = mpiml::AvgGradsOptions{}.bucket_cap_bytes;
    std::string json;
};

/// Times single calls: barrier, then one call of each method in turn (so drift
/// and other load hit all methods alike); a call's time is the slowest rank's.
/// The median is robust to the preemptions of a shared machine.
struct Timer {
    const Options& opt;
    std::vector<std::vector<double>> us;  // per method, per sample
    void run(const std::vector<std::function<void()>>& methods) {
        us.assign(methods.size(), std::vector<double>(static_cast<std::size_t>(opt.samples)));
        for (auto& m : methods)
            for (int i = 0; i < 20; ++i) m();  // warm up
        for (int i = 0; i < opt.samples; ++i)
            for (std::size_t k = 0; k < methods.size(); ++k) {
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = MPI_Wtime();
                methods[k]();
                us[k][static_cast<std::size_t>(i)] = (MPI_Wtime() - t0) * 1e6;
            }
        for (auto& v : us)
            MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX,
                          MPI_COMM_WORLD);
        for (auto& v : us) std::sort(v.begin(), v.end());
    }
    double quantile(std::size_t k, double q) const {
        return us[k][static_cast<std::size_t>(q * static_cast<double>(us[k].size() - 1))];
    }
};

struct Row {
    std::string hidden, op, method;
    std::size_t tensors, elements;
    double median_us, p10_us, p90_us, ratio;
};

std::string hidden_name(const std::vector<int64_t>& h) {
    std::string s = "(";
    for (std::size_t i = 0; i < h.size(); ++i) s += (i ? "," : "") + std::to_string(h[i]);
    return s + ")";
}

std::vector<int64_t> parse_hidden(const std::string& s) {
    std::vector<int64_t> out;
    std::stringstream ss(s);
    for (std::string part; std::getline(ss, part, ',');) out.push_back(std::stoll(part));
    if (out.empty()) throw std::invalid_argument("--hidden: expected sizes like 64,64");
    return out;
}

[[noreturn]] void usage(int code) {
    std::puts(
        "usage: mpirun -np 2 bench_torch_grads [options]\n"
        "  --samples N       timed calls per method (default 2000)\n"
        "  --hidden A,B      hidden sizes; repeat for several models (default 64,64 and 256,256)\n"
        "  --bucket-cap B    mpi_avg_grads bucket cap in bytes (default 25 MiB)\n"

        "  --json FILE       also write the results as JSON to FILE (rank 0)");
    std::exit(code);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(2);
            return argv[++i];
        };
        if (a == "--samples") o.samples = std::stoi(value());
        else if (a == "--hidden") o.hidden.push_back(parse_hidden(value()));
        else if (a == "--bucket-cap") o.bucket_cap = std::stoull(value());

        else if (a == "--json") o.json = value();
        else if (a == "--help" || a == "-h") usage(0);
        else usage(2);
    }
    if (o.hidden.empty()) o.hidden = {{64, 64}, {256, 256}};
    if (o.samples < 1) usage(2);
    return o;
}

// ------------------------------------------------------------- one model

void bench_model(const Options& opt, const std::vector<int64_t>& hidden, std::vector<Row>& rows) {
    const int rank = mpiml::proc_id(), size = mpiml::num_procs();
    torch::manual_seed(rank);
    auto make = [&] {
        torch::manual_seed(rank);
        ActorCritic m(17, 6, hidden);
        // Real gradients from one backward pass.
        const auto obs = torch::randn({32, 17});
        (m->mu_net->forward(obs).pow(2).mean() + m->v_net->forward(obs).pow(2).mean() +
         m->log_std.sum())
            .backward();
        return m;
    };
    ActorCritic ac = make();
    ActorCritic ac_views = make();  // its gradients move into shared buckets
    ActorCritic ac_a = make(), ac_b = make();  // two models averaged in turn
    ActorCritic ac_obj = make(), ac_obj_views = make();
    mpiml::GradAverager avg_obj(ac_obj, {opt.bucket_cap});
    mpiml::GradAverager avg_obj_views(ac_obj_views, {opt.bucket_cap, /*gradient_as_bucket_view=*/true});
    const auto params = ac->parameters();
    std::size_t numel = 0;
    for (const auto& p : params) numel += static_cast<std::size_t>(p.numel());
    const auto all = ac->named_parameters().size() + ac->named_buffers().size();

    // Sanity check: the fused average equals the per-parameter one.
    {
        std::vector<torch::Tensor> ref;
        for (const auto& p : params) {
            ref.push_back(p.grad().clone());
            MPI_Allreduce(MPI_IN_PLACE, ref.back().data_ptr(), static_cast<int>(p.numel()),
                          MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            ref.back().div_(size);
        }
        mpiml::mpi_avg_grads(ac, {opt.bucket_cap});
        double diff = 0;
        for (std::size_t i = 0; i < params.size(); ++i)
            diff = std::max(diff, (params[i].grad() - ref[i]).abs().max().item<double>());
        if (diff > 1e-6) {
            std::fprintf(stderr, "rank %d: fused and per-parameter averages differ by %g\n", rank,
                         diff);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }

    std::vector<float> flat(numel, 1.0f);
    const int n = static_cast<int>(numel);
    // The shared-memory floor of bucket views: the same bytes (and one flag
    // per tensor) averaged in one SharedBucket, no tensors involved.
    const std::size_t bucket_floats = numel + params.size();
    mpiml::SharedBucket bucket(bucket_floats * sizeof(float));
    std::fill_n(static_cast<float*>(bucket.data()), bucket_floats, 1.0f);
    const float inv = 1.0f / static_cast<float>(size);

    const std::vector<std::pair<std::string, std::function<void()>>> grads = {
        {"mpiml::mpi_avg_grads", [&] { mpiml::mpi_avg_grads(ac, {opt.bucket_cap}); }},
        {"GradAverager (plan held)", [&] { avg_obj(); }},
        {"GradAverager, bucket views", [&] { avg_obj_views(); }},
        {"mpi_avg_grads, bucket views",
         [&] { mpiml::mpi_avg_grads(ac_views, {opt.bucket_cap, /*gradient_as_bucket_view=*/true}); }},
        {"SharedBucket::average, same bytes", [&] { bucket.average(bucket_floats, MPI_FLOAT); }},
        {"SharedBucket::average, 16 floats", [&] { bucket.average(16, MPI_FLOAT); }},
        {"per-parameter MPI_Allreduce",
         [&] {
             for (const auto& p : params) {
                 const auto& g = p.grad();
                 auto* d = g.data_ptr<float>();
                 const auto m = g.numel();
                 MPI_Allreduce(MPI_IN_PLACE, d, static_cast<int>(m), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
                 for (int64_t i = 0; i < m; ++i) d[i] *= inv;
             }
         }},
        {"2 models in turn, views (pair)",
         [&] {
             const mpiml::AvgGradsOptions o{opt.bucket_cap, /*gradient_as_bucket_view=*/true};
             mpiml::mpi_avg_grads(ac_a, o);
             mpiml::mpi_avg_grads(ac_b, o);
         }},
        {"copy into a flat buffer and back",
         [&] {
             std::size_t off = 0;
             for (const auto& p : params) {
                 const auto m = static_cast<std::size_t>(p.numel());
                 std::memcpy(flat.data() + off, p.grad().data_ptr<float>(), m * sizeof(float));
                 off += m;
             }
             off = 0;
             for (const auto& p : params) {
                 const auto m = static_cast<std::size_t>(p.numel());
                 float* d = p.grad().data_ptr<float>();
                 for (std::size_t i = 0; i < m; ++i) d[i] = flat[off + i] * inv;
                 off += m;
             }
         }},
        {"one raw MPI_Allreduce",
         [&] { MPI_Allreduce(MPI_IN_PLACE, flat.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }},
    };
    const std::vector<std::pair<std::string, std::function<void()>>> syncs = {
        {"mpiml::sync_params", [&] { mpiml::sync_params(ac); }},
        {"per-tensor MPI_Bcast",
         [&] {
             for (const auto& p : params)
                 MPI_Bcast(p.data_ptr(), static_cast<int>(p.numel()), MPI_FLOAT, 0,
                           MPI_COMM_WORLD);
         }},
        {"one raw MPI_Bcast", [&] { MPI_Bcast(flat.data(), n, MPI_FLOAT, 0, MPI_COMM_WORLD); }},
    };

    for (const auto* group : {&grads, &syncs}) {
        std::vector<std::function<void()>> fns;
        for (const auto& [name, fn] : *group) fns.push_back(fn);
        Timer t{opt, {}};
        t.run(fns);
        const double floor = t.quantile(fns.size() - 1, 0.5);
        for (std::size_t k = 0; k < fns.size(); ++k)
            rows.push_back({hidden_name(hidden), group == &grads ? "average gradients" : "sync parameters",
                            (*group)[k].first, k == 0 && group == &syncs ? all : params.size(), numel,
                            t.quantile(k, 0.5), t.quantile(k, 0.1), t.quantile(k, 0.9),
                            t.quantile(k, 0.5) / floor});
    }
}

std::string json_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    return mpiml::run(argc, argv, [](int argc, char** argv) {
        const Options opt = parse(argc, argv);
        const int rank = mpiml::proc_id(), size = mpiml::num_procs();
        mpiml::setup_pytorch_for_mpi();

        std::vector<Row> rows;
        for (const auto& h : opt.hidden) bench_model(opt, h, rows);
        if (rank != 0) return 0;

        char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
        int len = 0;
        MPI_Get_library_version(lib, &len);
        std::string mpi(lib, static_cast<std::size_t>(len));
        mpi = mpi.substr(0, mpi.find_first_of(",\n"));
        char host[256] = {};
        gethostname(host, sizeof host - 1);
        char date[32] = {};
        const std::time_t now = std::time(nullptr);
        std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        double load = -1;  // other work on the machine skews the figures
        if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
            if (std::fscanf(f, "%lf", &load) != 1) load = -1;
            std::fclose(f);
        }
        const std::string torch_version = std::to_string(TORCH_VERSION_MAJOR) + "." +
                                          std::to_string(TORCH_VERSION_MINOR) + "." +
                                          std::to_string(TORCH_VERSION_PATCH);

        std::printf("# %s, %d ranks on %s (%ld cores, load %.2f), LibTorch %s, %d threads/rank, %s\n",
                    mpi.c_str(), size, host, cores, load, torch_version.c_str(),
                    at::get_num_threads(), date);
        std::printf("# per call, slowest rank, %d calls after a barrier each: median, 10th and "
                    "90th percentile; ratio of medians vs the single raw collective\n",
                    opt.samples);
        std::printf("%-10s %-18s %-32s %7s %9s %10s %10s %10s %7s\n", "hidden", "operation", "method",
                    "tensors", "floats", "median_us", "p10_us", "p90_us", "ratio");
        for (const auto& r : rows)
            std::printf("%-10s %-18s %-32s %7zu %9zu %10.2f %10.2f %10.2f %7.2f\n", r.hidden.c_str(),
                        r.op.c_str(), r.method.c_str(), r.tensors, r.elements, r.median_us,
                        r.p10_us, r.p90_us, r.ratio);

        if (!opt.json.empty()) {
            std::ofstream out(opt.json);
            out << "{\n  \"benchmark\": \"bench_torch_grads\",\n  \"mpi\": \"" << json_escape(mpi)
                << "\",\n  \"ranks\": " << size << ",\n  \"host\": \"" << json_escape(host)
                << "\",\n  \"cores\": " << cores << ",\n  \"load_average\": " << load << ",\n  \"torch\": \"" << torch_version
                << "\",\n  \"threads_per_rank\": " << at::get_num_threads()
                << ",\n  \"date\": \"" << date << "\",\n  \"samples\": " << opt.samples << ",\n  \"bucket_cap_bytes\": " << opt.bucket_cap

                << ",\n  \"results\": [\n";
            for (std::size_t i = 0; i < rows.size(); ++i) {
                const auto& r = rows[i];
                out << "    {\"hidden\": \"" << r.hidden << "\", \"operation\": \"" << r.op
                    << "\", \"method\": \"" << r.method << "\", \"tensors\": " << r.tensors
                    << ", \"floats\": " << r.elements << ", \"median_us\": " << r.median_us
                    << ", \"p10_us\": " << r.p10_us << ", \"p90_us\": " << r.p90_us
                    << ", \"ratio\": " << r.ratio << "}"
                    << (i + 1 < rows.size() ? ",\n" : "\n");
            }
            out << "  ]\n}\n";
            if (!out) throw std::runtime_error("cannot write " + opt.json);
        }
        return 0;
    });
}
