#include <mpiml/datatype.hpp>
#include <mpiml/error.hpp>

#include "core/agreement.hpp"
#include "core/state.hpp"

#include <mpi.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace mpiml {
namespace {
int world_rank_or(int fallback, int* size = nullptr) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin) return fallback;
    int r = fallback;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    if (size) MPI_Comm_size(MPI_COMM_WORLD, size);
    return r;
}
}  // namespace

Error::Error(std::string call, std::string what, int mpi_code)
    : std::runtime_error(call + " on " + detail::rank_tag() + ": " + what),
      call_(std::move(call)),
      rank_(world_rank_or(-1)),
      mpi_code_(mpi_code) {}

namespace detail {

std::string rank_tag() {
    int size = 0;
    const int r = world_rank_or(-1, &size);
    if (r < 0) return "rank ?";
    return "rank " + std::to_string(r) + "/" + std::to_string(size);
}

void check_mpi(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
    int cls = rc;
    MPI_Error_class(rc, &cls);
    std::string what = "MPI error " + std::to_string(cls) + ": " + std::string(text, len);
    if (cls == MPI_ERR_TRUNCATE)
        what += " (the ranks passed different counts or roots; MPIML_CHECK=1 names what each rank "
                "called)";
    throw Error(call, what, rc);
}

void fail(const char* call, const std::string& what) { throw Error(call, what); }


std::string rank_list(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
}

std::string group_ranks(const std::vector<std::string>& per_rank, int first, const char* verb_one,
                        const char* verb_many) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    auto add = [&](int r) {
        for (auto& g : groups)
            if (g.first == per_rank[r]) return g.second.push_back(r);
        groups.push_back({per_rank[r], {r}});
    };
    add(first);
    for (int r = 0; r < static_cast<int>(per_rank.size()); ++r)
        if (r != first) add(r);
    std::string text;
    for (auto& [what, ranks] : groups) {
        std::sort(ranks.begin(), ranks.end());
        text += (text.empty() ? "" : "; ") + rank_list(ranks) + " " +
                (ranks.size() == 1 ? verb_one : verb_many) + " " + what;
    }
    return text;
}

}  // namespace detail


}  // namespace mpiml
