// Collective, atomic checkpoints: a named set of state saved as step N.
//
//   mpiml::Checkpointer ck("ckpt", {.keep = 3});
//   mpiml::CheckpointState st;
//   if (auto r = ck.load_latest(st)) {         // newest checkpoint that verifies
//       start = r->step + 1;
//       st.shared.get("weights", weights);
//       st.per_rank.get("rng", engine);
//   }
//   ...
//   st.shared.put("weights", weights);          // the same on every rank
//   st.per_rank.put("rng", engine);             // this rank's own
//   ck.save(step, st);                           // collective
//
// On disk: DIR/step-00000012/ holds shared.bin (written once, by rank 0),
// rank-00000.bin ... (one per rank) and MANIFEST (JSON: step, world size,
// metadata, each file's size and XXH64 checksum, its save number and its
// own checksum). A save writes into a temporary directory, fsyncs every file,
// agrees across ranks that every file is durable, then rank 0 renames the
// directory into place (swaps it with a checkpoint of the same step) and
// fsyncs DIR: a crash at any moment leaves the previous checkpoints as they
// were. The newest checkpoint is the one saved last. A job's rank 0 holds
// DIR/.lock from its first save until it exits: a second job saving into DIR
// gets an error instead of clearing the first one's saves.
// LibTorch modules, optimizers and tensors: see <mpiml/torch.hpp>.
#pragma once

#include <mpiml/error.hpp>
#include <mpiml/session.hpp>

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace mpiml {

/// A checkpoint that could not be written or read: a file system error (full
/// disk, unwritable directory) or a torn or corrupt checkpoint. Raised on every
/// rank of the call; the message names the failing rank, the path and the
/// system's error text.
class CheckpointError : public Error {
public:
    CheckpointError(std::string call, std::string what, std::string path = {}, int error_code = 0);
    /// The file or directory concerned (the first failing rank's).
    const std::string& path() const noexcept { return path_; }
    /// errno of the failure; 0 when it was not a system error.
    int error_code() const noexcept { return error_code_; }

private:
    std::string path_;
    int error_code_ = 0;
};

/// How a type is stored in a checkpoint: specialize with
///   static std::string kind();                        // tag stored with the bytes
///   static void encode(const T& value, std::string& out);  // out is empty: append
///   static void decode(std::string_view in, T& value);
/// Provided: arithmetic types, std::string, std::vector of arithmetic types,
/// the standard random engines (std::mt19937, std::mt19937_64, ...), and in
/// <mpiml/torch.hpp> LibTorch modules, optimizers and tensors.
template <class T>
struct CheckpointCodec;

template <class T>
concept Checkpointable = requires(const T& c, T& m, std::string& out, std::string_view in) {
    { CheckpointCodec<T>::kind() } -> std::convertible_to<std::string>;
    CheckpointCodec<T>::encode(c, out);
    CheckpointCodec<T>::decode(in, m);
};

namespace detail {
[[noreturn]] void checkpoint_decode_failed(std::string_view name, std::string_view kind,
                                           std::string_view what);
}  // namespace detail

/// Named entries, each a kind tag and its bytes; one section of a checkpoint.
class StateMap {
public:
    struct Entry {
        std::string kind;
        std::string data;                      ///< the bytes, unless pieces is set
        std::vector<std::string_view> pieces;  ///< bytes not owned (put_view), in order
        std::size_t size() const;
        /// The bytes, contiguous. Throws for a view of several pieces (written
        /// by a save as one entry, readable once loaded back).
        std::string_view bytes() const;
    };

    /// Stores value under name, replacing an entry of that name and reusing
    /// its memory (a StateMap kept from one save to the next does not
    /// allocate its large buffers again).
    template <Checkpointable T>
    StateMap& put(std::string_view name, const T& value) {
        Entry& e = slot(name, CheckpointCodec<T>::kind());
        try {
            CheckpointCodec<T>::encode(value, e.data);
        } catch (...) {
            erase(name);
            throw;
        }
        return *this;
    }
    /// A string literal is stored as text.
    StateMap& put(std::string_view name, const char* text);
    /// Raw bytes (kind "bytes"): copied, or taken over (std::string&&).
    StateMap& put_bytes(std::string_view name, std::string_view data);
    StateMap& put_bytes(std::string_view name, std::span<const std::byte> data);
    StateMap& put_bytes(std::string_view name, std::string&& data);
    /// Raw bytes not copied: they must stay valid and unchanged until the
    /// save that writes them returns.
    StateMap& put_view(std::string_view name, std::string_view data, std::string_view kind = "bytes");
    StateMap& put_view(std::string_view name, std::span<const std::byte> data,
                       std::string_view kind = "bytes");
    /// One entry made of several pieces, not copied (e.g. a header and an array).
    StateMap& put_view(std::string_view name, std::vector<std::string_view> pieces,
                       std::string_view kind = "bytes");
    /// Bytes with a kind tag of the caller's choosing.
    StateMap& put_raw(std::string_view name, std::string kind, std::string data);

    /// Loads entry name into value. Throws mpiml::Error when there is no such
    /// entry, when it holds another kind, or when its bytes do not decode.
    template <Checkpointable T>
    void get(std::string_view name, T& value) const {
        const std::string kind = CheckpointCodec<T>::kind();
        const Entry& e = at(name, kind);
        try {
            CheckpointCodec<T>::decode(e.bytes(), value);
        } catch (const Error&) {
            throw;
        } catch (const std::exception& ex) {
            detail::checkpoint_decode_failed(name, kind, ex.what());
        }
    }
    template <Checkpointable T>
        requires std::default_initializable<T>
    T get(std::string_view name) const {
        T value{};
        get(name, value);
        return value;
    }
    /// The bytes of entry name, whatever its kind (valid while the entry lives).
    std::string_view bytes(std::string_view name) const { return at(name).bytes(); }
    /// Entry name; when kind is not empty, it must hold that kind.
    const Entry& at(std::string_view name, std::string_view kind = {}) const;

    bool contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }
    bool erase(std::string_view name);
    std::vector<std::string> names() const;
    std::size_t size() const { return entries_.size(); }
    bool empty() const { return entries_.empty(); }
    void clear() { entries_.clear(); }
    const std::map<std::string, Entry, std::less<>>& entries() const { return entries_; }

private:
    /// Entry name, created if needed, with this kind and empty data (capacity kept).
    Entry& slot(std::string_view name, std::string_view kind);
    std::map<std::string, Entry, std::less<>> entries_;
};

/// What one save writes and one load fills.
struct CheckpointState {
    /// The same on every rank (model, optimizer, step counters): rank 0's is
    /// written; every rank loads it.
    StateMap shared;
    /// This rank's own (random generators, data-loader position): one file per rank.
    StateMap per_rank;
    /// Written to the MANIFEST (rank 0's), e.g. a configuration or a git hash.
    std::map<std::string, std::string> metadata;
};

struct CheckpointOptions {
    /// Checkpoints kept after a save: the one just saved and the others saved
    /// last (0: keep all). Older ones are renamed out of the way once the
    /// new one is in place, then deleted in the background (the next save, and
    /// the process at exit, wait for that).
    int keep = 3;
    /// The ranks that save and load together (default: the session's).
    Comm comm = {};
};

/// A loaded checkpoint.
struct CheckpointInfo {
    std::int64_t step = -1;
    /// Ranks that saved it. When it differs from the current world size, the
    /// shared state loads, and ranks below world_size get their per-rank state;
    /// the others get none.
    int world_size = 0;
    std::filesystem::path path;
    /// Why newer checkpoints were passed over, one line each (rank 0 also
    /// prints each as a warning on stderr).
    std::vector<std::string> skipped;
};

/// Saves and loads the checkpoints of one directory. Every save and load is
/// collective over options.comm; errors are raised on every rank.
class Checkpointer {
public:
    explicit Checkpointer(std::filesystem::path dir, CheckpointOptions options = {});

    /// Writes state as checkpoint `step` (0 to 10^18 - 1, the same on every rank),
    /// replacing a checkpoint of that step, then removes the old ones beyond
    /// options.keep. Returns when the checkpoint is durable. On failure (full
    /// disk, unwritable directory) throws CheckpointError on every rank and
    /// leaves the previous checkpoints intact; so it does when another job's
    /// rank 0 holds DIR/.lock.
    void save(std::int64_t step, const CheckpointState& state);

    /// Loads the newest checkpoint (the one saved last: after a resume from an
    /// older step, not the abandoned higher steps) whose MANIFEST and every checksum verify
    /// (rank 0 checks the MANIFEST and shared.bin, each rank its own file, and
    /// all ranks agree), passing over torn or corrupt ones with a warning.
    /// Fills state (replacing its contents) and returns what was loaded;
    /// nullopt when there is none.
    std::optional<CheckpointInfo> load_latest(CheckpointState& state);
    /// Loads checkpoint `step`; nullopt when there is no such checkpoint,
    /// CheckpointError when it does not verify.
    std::optional<CheckpointInfo> load(std::int64_t step, CheckpointState& state);

    /// Removes every checkpoint of the directory, to start a run afresh
    /// (collective). Rank 0 takes DIR/.lock first: while another job saves
    /// into DIR it is a CheckpointError on every rank, and nothing is removed.
    void clear();

    /// Steps of the checkpoint directories present, ascending (not verified;
    /// not collective).
    std::vector<std::int64_t> steps() const;
    const std::filesystem::path& dir() const { return dir_; }
    const CheckpointOptions& options() const { return options_; }
    /// The directory of checkpoint step: dir/step-00000012.
    std::filesystem::path step_path(std::int64_t step) const;
    /// Waits until the old checkpoints that saves discarded are deleted
    /// (they are deleted in the background; not collective). Call it before
    /// removing a checkpoint directory by other means.
    static void wait_for_removals();

private:
    /// Every rank of comm passes the same step and directory, or all throw.
    void agree_on_call(std::int64_t step, MPI_Comm comm, const char* call) const;
    /// dir/.step-00000012.<what>-<pid>: a temporary or discarded checkpoint.
    std::filesystem::path hidden(std::int64_t step, const char* what) const;
    std::optional<CheckpointInfo> load_impl(std::optional<std::int64_t> only, CheckpointState& state,
                                            const char* call);
    std::filesystem::path dir_;
    CheckpointOptions options_;
};

// ------------------------------------------------------------------ codecs

namespace detail {
template <class T>
void checkpoint_put_le(T v, std::string& out) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    if constexpr (std::endian::native == std::endian::big)
        for (std::size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
    out.append(b, sizeof(T));
}
template <class T>
T checkpoint_get_le(const char* p) {
    char b[sizeof(T)];
    std::memcpy(b, p, sizeof(T));
    if constexpr (std::endian::native == std::endian::big)
        for (std::size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
    T v;
    std::memcpy(&v, b, sizeof(T));
    return v;
}
template <class T>
std::string checkpoint_scalar_kind() {
    if constexpr (std::is_same_v<T, bool>)
        return "bool";
    else if constexpr (std::is_floating_point_v<T>)
        return "f" + std::to_string(sizeof(T) * 8);
    else
        return (std::is_signed_v<T> ? "i" : "u") + std::to_string(sizeof(T) * 8);
}
[[noreturn]] inline void checkpoint_bad_size(std::size_t got, std::size_t unit) {
    throw std::runtime_error(std::to_string(got) + " bytes, for values of " +
                             std::to_string(unit) + " bytes");
}
template <class E>
std::string checkpoint_engine_text(const E& e) {
    std::ostringstream os;
    os << e;
    return os.str();
}
template <class E>
void checkpoint_engine_load(std::string_view in, E& e) {
    std::istringstream is{std::string(in)};
    E tmp;
    is >> tmp;
    if (is.fail()) throw std::runtime_error("not this engine's state text");
    e = tmp;
}
}  // namespace detail

/// Integers, floating point and bool: fixed width, little-endian. Kinds
/// "i8".."i64", "u8".."u64", "f32", "f64", "bool".
template <class T>
    requires(std::is_arithmetic_v<T> && (std::is_integral_v<T> || sizeof(T) <= 8))
struct CheckpointCodec<T> {
    static std::string kind() { return detail::checkpoint_scalar_kind<T>(); }
    static void encode(const T& v, std::string& out) {
        if constexpr (std::is_same_v<T, bool>)
            out.push_back(v ? 1 : 0);
        else
            detail::checkpoint_put_le(v, out);
    }
    static void decode(std::string_view in, T& v) {
        if (in.size() != (std::is_same_v<T, bool> ? 1 : sizeof(T)))
            detail::checkpoint_bad_size(in.size(), std::is_same_v<T, bool> ? 1 : sizeof(T));
        if constexpr (std::is_same_v<T, bool>)
            v = in[0] != 0;
        else
            v = detail::checkpoint_get_le<T>(in.data());
    }
};

/// Text (kind "text").
template <>
struct CheckpointCodec<std::string> {
    static std::string kind() { return "text"; }
    static void encode(const std::string& v, std::string& out) { out.assign(v); }
    static void decode(std::string_view in, std::string& v) { v.assign(in); }
};

/// Vectors of integers or floating point: kind "f32[]" etc., little-endian.
template <class T>
    requires(std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && sizeof(T) <= 8)
struct CheckpointCodec<std::vector<T>> {
    static std::string kind() { return detail::checkpoint_scalar_kind<T>() + "[]"; }
    static void encode(const std::vector<T>& v, std::string& out) {
        out.resize(v.size() * sizeof(T));
        if constexpr (std::endian::native == std::endian::little) {
            if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
        } else {
            out.clear();
            for (const T& x : v) detail::checkpoint_put_le(x, out);
        }
    }
    static void decode(std::string_view in, std::vector<T>& v) {
        if (in.size() % sizeof(T) != 0) detail::checkpoint_bad_size(in.size(), sizeof(T));
        v.resize(in.size() / sizeof(T));
        for (std::size_t i = 0; i < v.size(); ++i)
            v[i] = detail::checkpoint_get_le<T>(in.data() + i * sizeof(T));
    }
};

/// Standard random engines in their operator<< text form; the kind names the
/// engine's parameters, so an mt19937 state does not load into an mt19937_64.
template <class U, std::size_t w, std::size_t n, std::size_t m, std::size_t r, U a, std::size_t u,
          U d, std::size_t s, U b, std::size_t t, U c, std::size_t l, U f>
struct CheckpointCodec<std::mersenne_twister_engine<U, w, n, m, r, a, u, d, s, b, t, c, l, f>> {
    using E = std::mersenne_twister_engine<U, w, n, m, r, a, u, d, s, b, t, c, l, f>;
    static std::string kind() {
        return "mersenne_twister_engine<" + std::to_string(w) + "," + std::to_string(n) + "," +
               std::to_string(m) + "," + std::to_string(r) + "," + std::to_string(a) + ">";
    }
    static void encode(const E& e, std::string& out) { out = detail::checkpoint_engine_text(e); }
    static void decode(std::string_view in, E& e) { detail::checkpoint_engine_load(in, e); }
};
template <class U, U a, U c, U m>
struct CheckpointCodec<std::linear_congruential_engine<U, a, c, m>> {
    using E = std::linear_congruential_engine<U, a, c, m>;
    static std::string kind() {
        return "linear_congruential_engine<" + std::to_string(sizeof(U) * 8) + "," +
               std::to_string(a) + "," + std::to_string(c) + "," + std::to_string(m) + ">";
    }
    static void encode(const E& e, std::string& out) { out = detail::checkpoint_engine_text(e); }
    static void decode(std::string_view in, E& e) { detail::checkpoint_engine_load(in, e); }
};
template <class U, std::size_t w, std::size_t s, std::size_t r>
struct CheckpointCodec<std::subtract_with_carry_engine<U, w, s, r>> {
    using E = std::subtract_with_carry_engine<U, w, s, r>;
    static std::string kind() {
        return "subtract_with_carry_engine<" + std::to_string(w) + "," + std::to_string(s) + "," +
               std::to_string(r) + ">";
    }
    static void encode(const E& e, std::string& out) { out = detail::checkpoint_engine_text(e); }
    static void decode(std::string_view in, E& e) { detail::checkpoint_engine_load(in, e); }
};

}  // namespace mpiml
