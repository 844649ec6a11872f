// OSU-style allreduce and broadcast sweep (mpiml vs raw MPI), a single-core
// memcpy calibration at every size, the cost of first-touching fresh memory
// (page faults), and mpi_statistics_scalar.
//
//   mpirun -np 2 bench_collectives [--min-bytes=4] [--max-bytes=67108864] [--step=2]
//       [--rounds=7] [--round-ms=20] [--parts=sweep,pagefault,stats]
//       [--stats-sizes=1000,1000000]
//
// Rank 0 prints JSON lines (see bench_common.hpp for the timing protocol).
#include "bench_common.hpp"

#include <mpiml/mpiml.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

namespace {

volatile double sink = 0.0;

void clobber(void* p) { asm volatile("" : : "r"(p) : "memory"); }

std::vector<long> parse_list(const std::string& s) {
    std::vector<long> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(static_cast<long>(std::stod(item)));
    return out;
}

void sweep(std::size_t min_bytes, std::size_t max_bytes, std::size_t step,
           const bench::Protocol& proto) {
    const int p = bench::size();
    const std::size_t max_n = max_bytes / sizeof(float);
    std::vector<float> send(max_n, 1.0f), recv(max_n, 0.0f), bcast(max_n, 1.0f);
    std::vector<char> csrc(max_bytes, 1), cdst(max_bytes, 0);
    step = std::max<std::size_t>(step, 2);
    for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= step) {
        const std::size_t n = bytes / sizeof(float);
        std::span<const float> s(send.data(), n);
        std::span<float> r(recv.data(), n), b(bcast.data(), n);
        std::vector<bench::Variant> v = {
            {"mpiml", [&] { mpiml::allreduce(s, r, mpiml::Op::sum); }},
            {"MPI_Allreduce",
             [&] {
                 MPI_Allreduce(s.data(), r.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
             }},
            {"mpiml_bcast", [&] { mpiml::broadcast(b, 0); }, false, true},
            {"MPI_Bcast",
             [&] { MPI_Bcast(b.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD); },
             false, true},
            {"memcpy",
             [&] {
                 std::memcpy(cdst.data(), csrc.data(), bytes);
                 clobber(cdst.data());
             },
             true},
        };
        const auto t = bench::measure(v, proto);
        if (bench::rank() != 0) continue;
        const double ar_factor = 2.0 * (p - 1) / p;
        for (const auto& x : t) {
            const double algbw = static_cast<double>(bytes) / (x.median_us * 1e-6) / 1e9;
            std::string bench_name, impl = x.name;
            double factor = 1.0;
            if (x.name == "mpiml" || x.name == "MPI_Allreduce") {
                bench_name = "allreduce";
                factor = ar_factor;
            } else if (x.name == "memcpy") {
                bench_name = "memcpy";
            } else {
                bench_name = "broadcast";
                if (x.name == "mpiml_bcast") impl = "mpiml";
            }
            auto j = bench::timing_json("collectives", bench_name, {impl, x.iters, x.rounds,
                                                                     x.median_us, x.min_us});
            j.add("bytes", bytes).add("algbw_GBps", algbw);
            if (bench_name != "memcpy") j.add("busbw_GBps", algbw * factor);
            j.print();
        }
    }
}

// Page faults: what a buffer allocated fresh for every call costs (glibc
// maps allocations of 32 MiB and more anew each time). mmap, touch every
// page, munmap, on rank 0.
void pagefault(const bench::Protocol& proto) {
    constexpr std::size_t bytes = 16u << 20;
    const long page = sysconf(_SC_PAGESIZE);
    std::vector<bench::Variant> v = {
        {"first_touch",
         [&] {
             void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
             if (p == MAP_FAILED) std::abort();
             auto* c = static_cast<volatile char*>(p);
             for (std::size_t i = 0; i < bytes; i += static_cast<std::size_t>(page)) c[i] = 1;
             munmap(p, bytes);
         },
         true},
    };
    const auto t = bench::measure(v, proto);
    if (bench::rank() != 0) return;
    const double pages = static_cast<double>(bytes) / static_cast<double>(page);
    bench::timing_json("calibration", "page_fault", t[0])
        .add("bytes", bytes)
        .add("page_bytes", page)
        .add("us_per_page", t[0].median_us / pages)
        .add("ms_per_100MB", t[0].median_us / static_cast<double>(bytes) * 1e8 / 1e3)
        .print();
}

// The seed's algorithm (mean, then squared deviations, two float32
// allreduces) in C++ with raw MPI: separates the language from the algorithm.
std::pair<double, double> seed_statistics_raw(const std::vector<float>& x) {
    double s = 0.0;
    for (float v : x) s += v;
    float buf[2] = {static_cast<float>(s), static_cast<float>(x.size())}, g[2];
    MPI_Allreduce(buf, g, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const float mean = g[0] / g[1];
    double sq = 0.0;
    for (float v : x) sq += static_cast<double>((v - mean) * (v - mean));
    float lsq = static_cast<float>(sq), gsq = 0.0f;
    MPI_Allreduce(&lsq, &gsq, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return {mean, std::sqrt(gsq / g[1])};
}

void statistics(const std::vector<long>& sizes, const bench::Protocol& proto) {
    for (long n : sizes) {
        std::mt19937 gen(1234 + bench::rank());
        std::normal_distribution<float> dist(0.5f, 2.0f);
        std::vector<float> xf(static_cast<std::size_t>(n));
        for (auto& v : xf) v = dist(gen);
        std::vector<double> xd(xf.begin(), xf.end());
        std::vector<bench::Variant> v = {
            {"mpiml", [&] { sink = sink + mpiml::mpi_statistics_scalar(xf).std; }},
            {"mpiml_double_input", [&] { sink = sink + mpiml::mpi_statistics_scalar(xd).std; }},
            {"seed_algorithm_cpp_raw_mpi", [&] { sink = sink + seed_statistics_raw(xf).second; }},
        };
        const auto t = bench::measure(v, proto);
        if (bench::rank() != 0) continue;
        for (const auto& x : t)
            bench::timing_json("statistics", "mpi_statistics_scalar", x)
                .add("samples_per_rank", n)
                .print();
    }
}

// The seed's mpi_avg: a scalar (PPO's approximate KL) and a small vector.
void averages(const bench::Protocol& proto) {
    const float scalar = static_cast<float>(bench::rank()) + 0.5f;
    std::vector<float> vec(1000);
    for (std::size_t i = 0; i < vec.size(); ++i) vec[i] = static_cast<float>(i + bench::rank());
    std::vector<bench::Variant> vs = {{"mpiml", [&] { sink = sink + mpiml::mpi_avg(scalar); }}};
    std::vector<bench::Variant> vv = {{"mpiml", [&] { sink = sink + mpiml::mpi_avg(vec)[0]; }}};
    for (auto [elements, variants] : {std::pair{1, &vs}, std::pair{1000, &vv}}) {
        const auto t = bench::measure(*variants, proto);
        if (bench::rank() != 0) continue;
        for (const auto& x : t)
            bench::timing_json("mpi_avg", "mpi_avg", x).add("elements", elements).print();
    }
}

}  // namespace

int main(int argc, char** argv) {
    mpiml::Session session(argc, argv);
    bench::Protocol proto;
    proto.rounds = std::stoi(bench::arg(argc, argv, "rounds", "7"));
    proto.round_seconds = std::stod(bench::arg(argc, argv, "round-ms", "20")) * 1e-3;
    const auto min_bytes = static_cast<std::size_t>(std::stod(bench::arg(argc, argv, "min-bytes", "4")));
    const auto max_bytes =
        static_cast<std::size_t>(std::stod(bench::arg(argc, argv, "max-bytes", "67108864")));
    const auto step = static_cast<std::size_t>(std::stoi(bench::arg(argc, argv, "step", "2")));
    const std::string parts = bench::arg(argc, argv, "parts", "sweep,pagefault,stats,avg");
    if (bench::rank() == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        std::string v(version);  // first line only
        v = v.substr(0, v.find_first_of("\r\n"));
        bench::Json().add("suite", "meta").add("mpi_library_version", v).print();
    }
    if (parts.find("sweep") != std::string::npos) sweep(min_bytes, max_bytes, step, proto);
    if (parts.find("pagefault") != std::string::npos) pagefault(proto);
    if (parts.find("stats") != std::string::npos)
        statistics(parse_list(bench::arg(argc, argv, "stats-sizes", "1000,1000000")), proto);
    if (parts.find("avg") != std::string::npos) averages(proto);
    return 0;
}
