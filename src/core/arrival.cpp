// The node's arrival board: which ranks of this node entered which world
// collective, for "ranks that never arrived" (the watchdog, stall warnings).
#include "core/arrival.hpp"
#include "core/state.hpp"

#include <atomic>
#include <string>
#include <vector>

#include <unistd.h>

namespace mpiml::detail {
namespace {

// Node-local arrival board: one slot per rank of the node holding the
// sequence number of the last world collective it entered.
struct Board {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Win win = MPI_WIN_NULL;
    std::uint64_t* mine = nullptr;
    std::vector<std::uint64_t*> slots;  // by node rank
    std::vector<int> world_ranks;       // node rank -> world rank
    std::atomic<bool> ready{false};
    bool tried = false;
    bool unusable = false;  // set up, but a query failed: freed, never read
};
Board& board() {
    static auto* b = new Board;
    return *b;
}

// Freeing is collective, so it is registered where every rank registers it
// alike (the board's set-up).
void free_board_hook() {
    auto& b = board();
    if (b.ready.exchange(false) || b.unusable) {
        MPI_Win_free(&b.win);
        MPI_Comm_free(&b.node);
        b.unusable = false;
    }
}

}  // namespace

std::string missing_ranks(std::uint64_t my_seq, MPI_Comm comm) {
    auto& b = board();
    int n = 0;
    if (!state().world_set_up.load() && MPI_Comm_size(comm, &n) == MPI_SUCCESS && n == state().world_size)
        return "; a rank has not come to its first collective spanning every rank (this one waits "
               "for it to set up)";
    if (comm != MPI_COMM_WORLD || !b.ready.load()) return "";
    std::string late;
    for (std::size_t i = 0; i < b.slots.size(); ++i) {
        const std::uint64_t s = std::atomic_ref<std::uint64_t>(*b.slots[i]).load();
        if (s < my_seq)
            late += (late.empty() ? "" : ", ") + std::to_string(b.world_ranks[i]) +
                    " (last entered #" + std::to_string(s) + ")";
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
    const std::string node = std::string("this node (") + host + ")";
    if (late.empty()) return "; every rank on " + node + " arrived (a rank on another node may not have)";
    return "; ranks on " + node + " that never arrived: " + late;
}

void arrival_board_setup() {
    auto& b = board();
    if (b.tried) return;
    b.tried = true;  // once: a failed set-up is not retried (nor a collective again)
    // Collective over the world; without a board the watchdog still fires,
    // without naming late ranks.
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &b.node) !=
        MPI_SUCCESS) {
        b.node = MPI_COMM_NULL;
        return;
    }
    int n = 0;
    MPI_Comm_size(b.node, &n);
    void* base = nullptr;
    if (MPI_Win_allocate_shared(kBoardSegment, 1, MPI_INFO_NULL, b.node,
                                &base, &b.win) != MPI_SUCCESS) {
        MPI_Comm_free(&b.node);
        return;
    }
    b.mine = own_lines(base);
    *b.mine = 0;
    b.slots.assign(static_cast<std::size_t>(n), nullptr);
    std::vector<int> nr(static_cast<std::size_t>(n));
    b.world_ranks.assign(static_cast<std::size_t>(n), MPI_UNDEFINED);
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        MPI_Aint size = 0;
        int disp = 0;
        void* p = nullptr;
        ok = ok && MPI_Win_shared_query(b.win, r, &size, &disp, &p) == MPI_SUCCESS && p != nullptr;
        ok = ok && size >= kBoardSegment;
        b.slots[static_cast<std::size_t>(r)] = own_lines(p);
        nr[static_cast<std::size_t>(r)] = r;
    }
    MPI_Group gn, gw;
    MPI_Comm_group(b.node, &gn);
    MPI_Comm_group(MPI_COMM_WORLD, &gw);
    ok = ok && MPI_Group_translate_ranks(gn, n, nr.data(), gw, b.world_ranks.data()) == MPI_SUCCESS;
    MPI_Group_free(&gn);
    MPI_Group_free(&gw);
    // Freeing is collective: registered on every rank alike, board or not.
    register_finalize_hook(free_board_hook);
    b.ready.store(ok);
    if (!ok) b.unusable = true;
}

bool first_here_in(std::uint64_t world_seq) {
    auto& b = board();
    if (!b.ready.load()) return true;
    const int me = state().world_rank;
    for (std::size_t i = 0; i < b.slots.size(); ++i)
        if (b.world_ranks[i] < me && std::atomic_ref<std::uint64_t>(*b.slots[i]).load() >= world_seq)
            return false;
    return true;
}

void arrival_mark(std::uint64_t world_seq) {
    auto& b = board();
    if (b.ready.load(std::memory_order_relaxed))
        std::atomic_ref<std::uint64_t>(*b.mine).store(world_seq, std::memory_order_relaxed);
}

}  // namespace mpiml::detail
