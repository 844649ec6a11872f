// Checkpoints: round trips, keep-K, torn and corrupt checkpoints, full disk,
// unwritable directories; every rank checks its own result.
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

int rank() { return mpiml::proc_id(); }
int size() { return mpiml::num_procs(); }
std::string tag() { return "rank " + std::to_string(rank()) + "/" + std::to_string(size()); }

/// A fresh directory, the same on every rank (made by rank 0), removed at the end.
class Dir {
public:
    Dir() {
        std::string p;
        if (rank() == 0) {
            char templ[] = "/tmp/mpiml-ckpt-test-XXXXXX";
            if (!mkdtemp(templ)) std::abort();
            p = templ;
        }
        mpiml::broadcast(p);
        path_ = p;
    }
    ~Dir() {
        mpiml::barrier();
        mpiml::Checkpointer::wait_for_removals();  // old checkpoints go in the background
        if (rank() == 0) fs::remove_all(path_);
    }
    const fs::path& path() const { return path_; }
    fs::path operator/(const std::string& s) const { return path_ / s; }

private:
    fs::path path_;
};

std::string payload(int who, std::size_t n) {
    std::string s(n, '\0');
    std::mt19937 g(static_cast<unsigned>(1000 + who));
    for (auto& c : s) c = static_cast<char>(g());
    return s;
}

/// The state of "rank r at step s": shared parts equal on every rank.
mpiml::CheckpointState make_state(std::int64_t step) {
    mpiml::CheckpointState st;
    st.shared.put("step", step);
    st.shared.put_bytes("weights", payload(static_cast<int>(step), 5000));
    st.per_rank.put("rank", rank());
    st.per_rank.put_bytes("buffer", payload(100 * (rank() + 1) + static_cast<int>(step), 3000));
    return st;
}

void expect_state(const mpiml::CheckpointState& st, std::int64_t step) {
    EXPECT_EQ(st.shared.get<std::int64_t>("step"), step);
    EXPECT_EQ(st.shared.bytes("weights"), payload(static_cast<int>(step), 5000));
    EXPECT_EQ(st.per_rank.get<int>("rank"), rank());
    EXPECT_EQ(st.per_rank.bytes("buffer"), payload(100 * (rank() + 1) + static_cast<int>(step), 3000));
}

/// Runs f on rank 0 alone, between barriers (file surgery).
template <class F>
void on_rank0(F f) {
    mpiml::barrier();
    if (rank() == 0) f();
    mpiml::barrier();
}

void flip_byte(const fs::path& p, std::uintmax_t at) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
}

template <class F>
mpiml::CheckpointError expect_checkpoint_error(F f, const std::vector<std::string>& parts) {
    try {
        f();
    } catch (const mpiml::CheckpointError& e) {
        const std::string what = e.what();
        for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what << "\nlacks: " << p;
        EXPECT_EQ(e.rank(), rank());
        return e;
    }
    ADD_FAILURE() << "expected mpiml::CheckpointError on " << tag();
    return mpiml::CheckpointError("", "");
}

/// Temporary directories of saves (discarded checkpoints, ".old-", may still
/// be being removed in the background).
std::vector<std::string> leftovers(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename();
        if (n.rfind(".step-", 0) == 0 && n.find(".tmp-") != std::string::npos) out.push_back(n);
    }
    return out;
}

/// load_latest (its warning kept off the test's output) that passed over
/// step 2 to step 1: the one reason it gives.
std::string fell_back_to_step_1(mpiml::Checkpointer& ck, mpiml::CheckpointState& st) {
    testing::internal::CaptureStderr();
    auto r = ck.load_latest(st);
    testing::internal::GetCapturedStderr();
    if (!r) {
        ADD_FAILURE() << "nothing loaded";
        return {};
    }
    EXPECT_EQ(r->step, 1);
    if (r->skipped.size() != 1) {
        ADD_FAILURE() << r->skipped.size() << " reasons, expected 1";
        return {};
    }
    return r->skipped[0];
}

TEST(Checkpoint, RoundTripOfEveryCoreKind) {
    Dir d;
    mpiml::Checkpointer ck(d.path());
    mpiml::CheckpointState none;
    EXPECT_FALSE(ck.load_latest(none));

    std::mt19937 g32(7u + static_cast<unsigned>(rank()));
    std::mt19937_64 g64(9u + static_cast<unsigned>(rank()));
    std::minstd_rand lcg(3u + static_cast<unsigned>(rank()));
    for (int i = 0; i < 1000; ++i) g32(), g64(), lcg();

    mpiml::CheckpointState st;
    st.shared.put("i8", std::int8_t{-5}).put("u16", std::uint16_t{65000}).put("i64", std::int64_t{-1} << 40);
    st.shared.put("u64", ~std::uint64_t{0}).put("f32", 1.5f).put("f64", -2.25e300).put("flag", true);
    st.shared.put("name", "resnet").put("text", std::string("a\0b", 3));
    st.shared.put("floats", std::vector<float>{1.f, -2.f, 3.5f}).put("empty", std::vector<double>{});
    st.shared.put_bytes("blob", payload(1, 70000));
    const std::string viewed = payload(2, 50000);
    st.shared.put_view("view", viewed).put_view("viewed_kind", std::string_view(viewed).substr(0, 4), "i32");
    st.shared.put_view("pieces", std::vector<std::string_view>{"ab", "", "cde"});
    EXPECT_THROW(st.shared.bytes("pieces"), mpiml::Error);
    st.per_rank.put("g32", g32).put("g64", g64).put("lcg", lcg).put("rank", rank());
    st.metadata = {{"model", "mlp"}, {"commit", "abc123"}};
    ck.save(12, st);

    // An uninterrupted run's next numbers.
    std::vector<std::uint64_t> next;
    for (int i = 0; i < 5; ++i) next.push_back(g32()), next.push_back(g64()), next.push_back(lcg());

    mpiml::CheckpointState in;
    in.shared.put("stale", 1);  // replaced by the load
    auto r = ck.load_latest(in);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 12);
    EXPECT_EQ(r->world_size, size());
    EXPECT_EQ(r->path, d / "step-00000012");
    EXPECT_TRUE(r->skipped.empty());
    EXPECT_FALSE(in.shared.contains("stale"));
    EXPECT_EQ(in.shared.get<std::int8_t>("i8"), -5);
    EXPECT_EQ(in.shared.get<std::uint16_t>("u16"), 65000);
    EXPECT_EQ(in.shared.get<std::int64_t>("i64"), std::int64_t{-1} << 40);
    EXPECT_EQ(in.shared.get<std::uint64_t>("u64"), ~std::uint64_t{0});
    EXPECT_EQ(in.shared.get<float>("f32"), 1.5f);
    EXPECT_EQ(in.shared.get<double>("f64"), -2.25e300);
    EXPECT_EQ(in.shared.get<bool>("flag"), true);
    EXPECT_EQ(in.shared.get<std::string>("name"), "resnet");
    EXPECT_EQ(in.shared.get<std::string>("text"), std::string("a\0b", 3));
    EXPECT_EQ(in.shared.get<std::vector<float>>("floats"), (std::vector<float>{1.f, -2.f, 3.5f}));
    EXPECT_TRUE(in.shared.get<std::vector<double>>("empty").empty());
    EXPECT_EQ(in.shared.bytes("blob"), payload(1, 70000));
    EXPECT_EQ(in.shared.at("blob").kind, "bytes");
    EXPECT_EQ(in.shared.bytes("view"), viewed);
    EXPECT_EQ(in.shared.bytes("pieces"), "abcde");
    EXPECT_EQ(in.shared.at("view").kind, "bytes");
    EXPECT_EQ(in.shared.get<std::int32_t>("viewed_kind"), st.shared.get<std::int32_t>("viewed_kind"));
    EXPECT_EQ(in.per_rank.get<int>("rank"), rank());
    EXPECT_EQ(in.metadata, st.metadata);

    std::mt19937 h32;
    std::mt19937_64 h64;
    std::minstd_rand hlcg;
    in.per_rank.get("g32", h32);
    in.per_rank.get("g64", h64);
    in.per_rank.get("lcg", hlcg);
    std::vector<std::uint64_t> resumed;
    for (int i = 0; i < 5; ++i) resumed.push_back(h32()), resumed.push_back(h64()), resumed.push_back(hlcg());
    EXPECT_EQ(resumed, next);

    // The layout: shared.bin, one file per rank, the MANIFEST; no temporary left.
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(d / "step-00000012")) files.push_back(e.path().filename());
    std::sort(files.begin(), files.end());
    std::vector<std::string> want = {"MANIFEST"};
    for (int i = 0; i < size(); ++i) {
        char b[32];
        std::snprintf(b, sizeof b, "rank-%05d.bin", i);
        want.push_back(b);
    }
    want.push_back("shared.bin");
    EXPECT_EQ(files, want);
    EXPECT_TRUE(leftovers(d.path()).empty());
    std::ifstream mf(d / "step-00000012" / "MANIFEST");
    const std::string manifest((std::istreambuf_iterator<char>(mf)), {});
    for (const char* s : {"\"world_size\": ", "\"step\": 12", "\"xxh64\": \"", "\"commit\": \"abc123\""})
        EXPECT_NE(manifest.find(s), std::string::npos) << manifest;
}

TEST(Checkpoint, StateMapErrorsNameTheEntry) {
    mpiml::StateMap m;
    m.put("lr", 0.1).put("n", std::int64_t{3}).put("g", std::mt19937_64(1));
    m.put_raw("bad", "f64", "xyz");
    auto expect = [](auto f, std::vector<std::string> parts) {
        try {
            f();
            ADD_FAILURE() << "expected mpiml::Error";
        } catch (const mpiml::Error& e) {
            for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
        }
    };
    expect([&] { m.get<double>("missing"); }, {"mpiml::StateMap::get", "no entry 'missing'", "g, lr, n"});
    expect([&] { m.get<int>("n"); }, {"'n' holds i64, not i32"});
    expect([&] { m.get<float>("lr"); }, {"'lr' holds f64, not f32"});
    expect([&] {
        std::mt19937 g;
        m.get("g", g);
    }, {"'g' holds mersenne_twister_engine<64,"});
    expect([&] { m.get<double>("bad"); }, {"entry 'bad' (f64) does not decode", "3 bytes"});
    expect([&] { m.put("", 1); }, {"the entry name is empty"});
    EXPECT_TRUE(m.erase("bad"));
    EXPECT_EQ(m.names(), (std::vector<std::string>{"g", "lr", "n"}));

    // Putting an entry again reuses its memory.
    const std::string big(1 << 20, 'a'), other(1 << 20, 'b');
    m.put_bytes("big", big);
    const char* where = m.at("big").data.data();
    m.put_bytes("big", other);
    EXPECT_EQ(m.at("big").data.data(), where);
    EXPECT_EQ(m.bytes("big"), other);
    m.put("big", std::vector<float>(1000, 1.f));
    EXPECT_EQ(m.at("big").data.data(), where);
    EXPECT_EQ(m.at("big").kind, "f32[]");
    EXPECT_EQ(m.get<std::vector<float>>("big"), std::vector<float>(1000, 1.f));
}

TEST(Checkpoint, KeepsTheLastK) {
    Dir d;
    mpiml::Checkpointer ck(d.path(), {.keep = 3});
    for (std::int64_t s = 1; s <= 5; ++s) ck.save(s * 10, make_state(s * 10));
    EXPECT_EQ(ck.steps(), (std::vector<std::int64_t>{30, 40, 50}));
    mpiml::CheckpointState st;
    auto r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 50);
    expect_state(st, 50);
    // The oldest kept one loads too.
    ASSERT_TRUE(ck.load(30, st));
    expect_state(st, 30);
    EXPECT_FALSE(ck.load(20, st));

    // Saving a step again replaces it.
    mpiml::CheckpointState again = make_state(7);
    ck.save(50, again);
    r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 50);
    EXPECT_EQ(st.shared.get<std::int64_t>("step"), 7);
    EXPECT_EQ(ck.steps(), (std::vector<std::int64_t>{30, 40, 50}));
    EXPECT_TRUE(leftovers(d.path()).empty());

    mpiml::Checkpointer one(d.path(), {.keep = 1});
    one.save(60, make_state(60));
    EXPECT_EQ(ck.steps(), (std::vector<std::int64_t>{60}));
    mpiml::Checkpointer all(d.path(), {.keep = 0});
    for (std::int64_t s = 61; s <= 65; ++s) all.save(s, make_state(s));
    EXPECT_EQ(ck.steps().size(), 6u);
}

// A run resumed from an older step: the newest checkpoint is the one saved
// last, not the abandoned run's higher steps, for loads and for pruning.
TEST(Checkpoint, ResumedFromAnOlderStepTheLastSavedIsTheNewest) {
    Dir d;
    mpiml::Checkpointer ck(d.path(), {.keep = 3});
    for (std::int64_t s = 1; s <= 4; ++s) ck.save(s, make_state(s));  // 2, 3, 4 kept
    mpiml::CheckpointState st;
    ASSERT_TRUE(ck.load(2, st));
    ck.save(3, make_state(30));  // the resumed run's step 3 replaces the abandoned one
    auto r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 3);
    expect_state(st, 30);
    ck.save(1, make_state(10));  // resumed again, from further back
    r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 1);
    expect_state(st, 10);
    // keep = 3: the three saved last (3, 4 was saved before the resumed 3)
    EXPECT_EQ(ck.steps(), (std::vector<std::int64_t>{1, 3, 4}));
    ck.save(2, make_state(20));
    EXPECT_EQ(ck.steps(), (std::vector<std::int64_t>{1, 2, 3}));
    r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 2);
    expect_state(st, 20);
}

TEST(Checkpoint, StepBeyondEighteenDigitsIsRefused) {
    Dir d;
    mpiml::Checkpointer ck(d.path());
    const std::int64_t top = 999'999'999'999'999'999;
    ck.save(top, make_state(5));
    mpiml::CheckpointState st;
    auto r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, top);
    EXPECT_EQ(ck.steps(), (std::vector<std::int64_t>{top}));
    mpiml_test::expect_error([&] { ck.save(top + 1, make_state(5)); },
                             {"mpiml::Checkpointer::save", "step must be at most 999999999999999999"});
}

// The MANIFEST's metadata and file list are checksummed too.
TEST(Checkpoint, ChangedManifestFallsBack) {
    Dir d;
    mpiml::Checkpointer ck(d.path());
    mpiml::CheckpointState st = make_state(1);
    st.metadata["lr"] = "0.001";
    ck.save(1, st);
    st = make_state(2);
    st.metadata["lr"] = "0.001";
    ck.save(2, st);
    on_rank0([&] {
        const fs::path m = d / "step-00000002" / "MANIFEST";
        std::ifstream in(m);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const auto at = text.find("0.001");
        ASSERT_NE(at, std::string::npos);
        text.replace(at, 5, "0.901");
        std::ofstream(m, std::ios::trunc) << text;
    });
    mpiml::CheckpointState got;
    EXPECT_NE(fell_back_to_step_1(ck, got).find("MANIFEST: checksum mismatch"), std::string::npos);
    EXPECT_EQ(got.metadata.at("lr"), "0.001");
}

// Two jobs saving into one directory would clear each other's saves under
// way and prune each other's checkpoints: the second one's save is an error.
TEST(Checkpoint, AnotherJobSavingIntoTheDirectoryIsAnError) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    Dir d;
    if (rank() == 0) {
        mpiml::Checkpointer mine(d.path(), {.comm = mpiml::Comm(MPI_COMM_SELF)});
        mine.save(1, make_state(1));
    }
    mpiml::barrier();
    if (rank() == 1) {
        mpiml::Checkpointer other(d.path(), {.comm = mpiml::Comm(MPI_COMM_SELF)});
        expect_checkpoint_error([&] { other.save(2, make_state(2)); },
                                {"step 2 not saved in " + d.path().string(),
                                 "another job saves checkpoints into " + d.path().string(),
                                 "host", "give each job a directory of its own"});
        expect_checkpoint_error([&] { other.clear(); },
                                {"mpiml::Checkpointer::clear", "another job saves checkpoints into"});
        EXPECT_EQ(other.steps(), (std::vector<std::int64_t>{1}));
    }
    mpiml::barrier();
    mpiml::Checkpointer ck(d.path());  // the first job's rank 0 holds the lock
    ck.save(3, make_state(3));
    mpiml::CheckpointState st;
    auto r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 3);
    expect_state(st, 3);
    ck.clear();  // a fresh start
    EXPECT_TRUE(ck.steps().empty());
    EXPECT_FALSE(ck.load_latest(st));
    ck.save(1, make_state(1));
    EXPECT_EQ(ck.steps(), (std::vector<std::int64_t>{1}));
}

// The newest checkpoint damaged in one file: every rank falls back to the
// previous one, and the reason names the file and what is wrong.
void fallback_case(const std::string& file, bool truncate, const std::string& why) {
    Dir d;
    mpiml::Checkpointer ck(d.path());
    ck.save(1, make_state(1));
    ck.save(2, make_state(2));
    const fs::path victim = d / "step-00000002" / file;
    on_rank0([&] {
        const auto n = fs::file_size(victim);
        if (truncate)
            fs::resize_file(victim, n / 2);
        else
            flip_byte(victim, n - 10);
    });
    mpiml::CheckpointState st;
    testing::internal::CaptureStderr();
    auto r = ck.load_latest(st);
    const std::string err = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 1);
    expect_state(st, 1);
    ASSERT_EQ(r->skipped.size(), 1u);
    const std::string& s = r->skipped[0];
    for (const std::string& p : {(d / "step-00000002").string(), file, why})
        EXPECT_NE(s.find(p), std::string::npos) << s << "\nlacks: " << p;
    if (rank() == 0) {
        EXPECT_NE(err.find("[mpiml] warning: mpiml::Checkpointer::load_latest: checkpoint "), std::string::npos) << err;
        EXPECT_NE(err.find(why), std::string::npos) << err;
        EXPECT_NE(err.find("trying the previous one"), std::string::npos) << err;
    } else {
        EXPECT_EQ(err, "");
    }
    // An explicit load of the damaged step is an error on every rank.
    expect_checkpoint_error([&] { ck.load(2, st); }, {"mpiml::Checkpointer::load on " + tag(), file, why});
    // The next save replaces it; all is well again.
    ck.save(2, make_state(2));
    r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 2);
    EXPECT_TRUE(r->skipped.empty());
}

std::string last_rank_file() {
    char b[32];
    std::snprintf(b, sizeof b, "rank-%05d.bin", size() - 1);
    return b;
}

TEST(Checkpoint, TruncatedRankFileFallsBack) { fallback_case(last_rank_file(), true, "truncated or torn"); }
TEST(Checkpoint, TruncatedSharedFileFallsBack) { fallback_case("shared.bin", true, "truncated or torn"); }
TEST(Checkpoint, FlippedByteInRankFileFallsBack) { fallback_case(last_rank_file(), false, "checksum mismatch"); }
TEST(Checkpoint, FlippedByteInSharedFileFallsBack) { fallback_case("shared.bin", false, "checksum mismatch"); }
TEST(Checkpoint, TruncatedManifestFallsBack) { fallback_case("MANIFEST", true, "MANIFEST: unreadable"); }

TEST(Checkpoint, MissingFileFallsBack) {
    Dir d;
    mpiml::Checkpointer ck(d.path());
    ck.save(1, make_state(1));
    ck.save(2, make_state(2));
    on_rank0([&] { fs::remove(d / "step-00000002" / last_rank_file()); });
    mpiml::CheckpointState st;
    const std::string why = fell_back_to_step_1(ck, st);
    EXPECT_NE(why.find("cannot open"), std::string::npos) << why;
    EXPECT_NE(why.find("No such file or directory"), std::string::npos) << why;
}

TEST(Checkpoint, EveryCheckpointCorruptLoadsNothing) {
    Dir d;
    mpiml::Checkpointer ck(d.path());
    ck.save(1, make_state(1));
    ck.save(2, make_state(2));
    on_rank0([&] {
        flip_byte(d / "step-00000001" / "shared.bin", 40);
        fs::resize_file(d / "step-00000002" / "shared.bin", 10);
    });
    mpiml::CheckpointState st;
    testing::internal::CaptureStderr();
    EXPECT_FALSE(ck.load_latest(st));
    const std::string err = testing::internal::GetCapturedStderr();
    if (rank() == 0) EXPECT_NE(err.find("no usable checkpoint in " + d.path().string()), std::string::npos) << err;
}

// A crashed save leaves a temporary directory: loads ignore it, saves remove it.
TEST(Checkpoint, CrashedSaveIsIgnoredAndCleared) {
    Dir d;
    mpiml::Checkpointer ck(d.path());
    ck.save(1, make_state(1));
    on_rank0([&] {
        fs::create_directory(d / ".step-00000002.tmp-999999");
        std::ofstream(d / ".step-00000002.tmp-999999" / "shared.bin") << "partial";
    });
    mpiml::CheckpointState st;
    auto r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 1);
    EXPECT_TRUE(r->skipped.empty());
    ck.save(2, make_state(2));
    EXPECT_TRUE(leftovers(d.path()).empty());
}

// World size changes: saved by the first size-1 ranks, loaded by all, and back.
TEST(Checkpoint, DifferentWorldSize) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    Dir d;
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rank() < size() - 1 ? 0 : MPI_UNDEFINED, rank(), &sub);
    if (sub != MPI_COMM_NULL) {
        mpiml::Checkpointer small(d.path(), {.comm = sub});
        small.save(5, make_state(5));
    }
    mpiml::barrier();
    mpiml::Checkpointer ck(d.path());
    mpiml::CheckpointState st;
    auto r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 5);
    EXPECT_EQ(r->world_size, size() - 1);
    EXPECT_EQ(st.shared.bytes("weights"), payload(5, 5000));
    if (rank() < size() - 1)
        expect_state(st, 5);
    else
        EXPECT_TRUE(st.per_rank.empty());

    // Saved by all, loaded by fewer: each has its own per-rank state.
    ck.save(6, make_state(6));
    if (sub != MPI_COMM_NULL) {
        mpiml::Checkpointer small(d.path(), {.comm = sub});
        auto r2 = small.load_latest(st);
        ASSERT_TRUE(r2);
        EXPECT_EQ(r2->world_size, size());
        expect_state(st, 6);
        MPI_Comm_free(&sub);
    }
}

TEST(Checkpoint, MismatchedStepsOrDirectoriesAreAnErrorOnEveryRank) {
    if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
    Dir d;
    mpiml::Checkpointer ck(d.path());
    try {
        ck.save(rank() == size() - 1 ? 4 : 3, make_state(3));
        ADD_FAILURE() << "expected mpiml::Error";
    } catch (const mpiml::Error& e) {
        EXPECT_NE(std::string(e.what()).find("ranks disagree on the step (3 to 4)"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(ck.steps().empty());

    mpiml::Checkpointer mine(d / ("r" + std::to_string(rank())));
    mpiml::CheckpointState st;
    for (int i = 0; i < 2; ++i) {
        try {
            if (i == 0)
                mine.save(1, make_state(1));
            else
                mine.load_latest(st);
            ADD_FAILURE() << "expected mpiml::Error";
        } catch (const mpiml::Error& e) {
            EXPECT_NE(std::string(e.what()).find("ranks disagree on the directory (this rank's: " +
                                                 (d / ("r" + std::to_string(rank()))).string() + ")"),
                      std::string::npos)
                << e.what();
        }
    }
}

TEST(Checkpoint, UnwritableDirectoryIsAnErrorOnEveryRank) {
    Dir d;
    on_rank0([&] { std::ofstream(d / "file") << "x"; });
    const fs::path bad = d / "file" / "ckpt";
    mpiml::Checkpointer ck(bad);
    auto e = expect_checkpoint_error([&] { ck.save(1, make_state(1)); },
                                     {"mpiml::Checkpointer::save on " + tag(), "step 1 not saved in " + bad.string(),
                                      "rank 0: cannot create directory " + bad.string(), "Not a directory"});
    EXPECT_EQ(e.error_code(), ENOTDIR);
    EXPECT_EQ(e.path(), bad.string());
    mpiml::CheckpointState st;
    expect_checkpoint_error([&] { ck.load_latest(st); },
                            {"mpiml::Checkpointer::load_latest on " + tag(), bad.string(), "Not a directory"});
    expect_checkpoint_error([&] { mpiml::Checkpointer(d / "file").load_latest(st); },
                            {"cannot use directory " + (d / "file").string(), "Not a directory"});
}

// A full disk: a 1 MiB tmpfs. Every rank raises the error, the temporary
// directory is gone and the previous checkpoint still loads.
TEST(Checkpoint, FullDiskIsAnErrorOnEveryRank) {
    Dir d;
    const fs::path mnt = d / "small";
    int ok = 0;
    std::string why;
    if (rank() == 0) {
        fs::create_directory(mnt);
        ok = ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") == 0;
        if (!ok) why = std::strerror(errno);
    }
    mpiml::broadcast(ok);
    mpiml::broadcast(why);
    if (!ok) GTEST_SKIP() << "cannot mount a tmpfs here (" << why << "): the full-disk case needs root";
    struct Unmount {
        fs::path p;
        ~Unmount() {
            mpiml::barrier();
            if (rank() == 0) ::umount2(p.c_str(), MNT_DETACH);
        }
    } unmount{mnt};

    mpiml::Checkpointer ck(mnt);
    ck.save(1, make_state(1));

    // The last rank's own state does not fit.
    mpiml::CheckpointState big = make_state(2);
    if (rank() == size() - 1) big.per_rank.put_bytes("huge", std::string(2 << 20, 'x'));
    auto e = expect_checkpoint_error([&] { ck.save(2, big); },
                                     {"mpiml::Checkpointer::save on " + tag(), "step 2 not saved in " + mnt.string(),
                                      "cannot write ", "No space left on device",
                                      "the previous checkpoints are intact"});
    EXPECT_EQ(e.error_code(), ENOSPC);
    EXPECT_NE(e.path().find(mnt.string() + "/.step-00000002.tmp-"), std::string::npos) << e.path();

    // The shared state does not fit (rank 0 fails).
    mpiml::CheckpointState big_shared = make_state(3);
    big_shared.shared.put_bytes("huge", std::string(2 << 20, 'y'));
    e = expect_checkpoint_error([&] { ck.save(3, big_shared); },
                                {"step 3 not saved", "/shared.bin: No space left on device"});
    EXPECT_EQ(e.error_code(), ENOSPC);

    mpiml::barrier();
    EXPECT_TRUE(leftovers(mnt).empty());
    mpiml::CheckpointState st;
    auto r = ck.load_latest(st);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->step, 1);
    expect_state(st, 1);
    // With room again, saving works.
    ck.save(4, make_state(4));
    ASSERT_TRUE(ck.load_latest(st));
    expect_state(st, 4);
}

}  // namespace
