// mpiml-ppo's epoch logger and plot: statistics pooled over ranks, ranks
// (or all ranks) without episodes, Spinning Up's progress.txt format.
#include "logger.hpp"
#include "plot.hpp"

#include <mpiml/collectives.hpp>
#include <mpiml/session.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace ppo;

namespace {

/// A fresh folder shared by all ranks (rank 0 picks the name).
std::string temp_dir(const std::string& tag) {
    std::string dir;
    if (mpiml::proc_id() == 0) {
        dir = (std::filesystem::temp_directory_path() /
               ("mpiml_ppo_" + tag + "_" + std::to_string(::getpid())))
                  .string();
        std::filesystem::remove_all(dir);
    }
    mpiml::broadcast(dir);
    return dir;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace

TEST(FormatValue, LikePythonStr) {
    EXPECT_EQ(format_value(3, true), "3");
    EXPECT_EQ(format_value(20.0, false), "20.0");
    EXPECT_EQ(format_value(0.1, false), "0.1");
    EXPECT_EQ(format_value(1e-05, false), "1e-05");
    EXPECT_EQ(format_value(NAN, false), "nan");
}

TEST(EpochLogger, PoolsStatisticsOverRanks) {
    const int r = mpiml::proc_id(), n = mpiml::num_procs();
    EpochLogger log("");
    // Rank r stores r+1 samples, all equal to r: pooled mean = sum r(r+1) / sum (r+1).
    for (int i = 0; i <= r; ++i) log.store("EpRet", static_cast<double>(r));
    log.log_tabular_stats("EpRet", true);
    double num = 0, den = 0;
    for (int k = 0; k < n; ++k) num += k * (k + 1.0), den += k + 1.0;
    EXPECT_NEAR(log.get("AverageEpRet"), num / den, 1e-12);
    EXPECT_EQ(log.get("MinEpRet"), 0.0);
    EXPECT_EQ(log.get("MaxEpRet"), n - 1.0);
    EXPECT_FALSE(std::isnan(log.get("StdEpRet")));
}

TEST(EpochLogger, SomeRanksWithoutEpisodes) {
    const int r = mpiml::proc_id(), n = mpiml::num_procs();
    EpochLogger log("");
    if (r == 0) log.store("EpRet", std::vector<double>{10.0, 20.0});
    log.log_tabular_stats("EpRet", true);
    EXPECT_DOUBLE_EQ(log.get("AverageEpRet"), 15.0);
    EXPECT_DOUBLE_EQ(log.get("StdEpRet"), 5.0);
    EXPECT_DOUBLE_EQ(log.get("MaxEpRet"), 20.0);
    EXPECT_DOUBLE_EQ(log.get("MinEpRet"), 10.0);
    // And the last rank alone.
    if (r == n - 1) log.store("EpLen", 7.0);
    log.log_tabular_stats("EpLen", false, true);
    EXPECT_DOUBLE_EQ(log.get("EpLen"), 7.0);
}

TEST(EpochLogger, NoRankWithEpisodesLogsNaN) {
    EpochLogger log("");
    log.log_tabular_stats("EpRet", true);
    EXPECT_TRUE(std::isnan(log.get("AverageEpRet")));
    EXPECT_TRUE(std::isnan(log.get("StdEpRet")));
    EXPECT_TRUE(std::isnan(log.get("MaxEpRet")));
    EXPECT_TRUE(std::isnan(log.get("MinEpRet")));
    log.log_tabular_stats("EpLen", false, true);
    EXPECT_TRUE(std::isnan(log.get("EpLen")));
    log.dump_tabular();  // still fine
}

TEST(EpochLogger, WritesSpinningUpProgressFileOnRank0) {
    const std::string dir = temp_dir("progress");
    {
        EpochLogger log(dir);
        for (int epoch = 0; epoch < 3; ++epoch) {
            log.log_tabular("Epoch", static_cast<std::int64_t>(epoch));
            if (epoch != 1) log.store("EpRet", 1.5 + epoch);  // epoch 1: no episode anywhere
            log.log_tabular_stats("EpRet", true);
            log.store("LossV", 0.25);
            log.log_tabular_stats("LossV", false, true);
            log.log_tabular("TotalEnvInteracts", static_cast<std::int64_t>(4000 * (epoch + 1)));
            log.log_tabular("Time", 2.0);
            log.dump_tabular();
        }
        EXPECT_EQ(log.progress().rows.size(), 3u);
        EXPECT_THROW(log.log_tabular("NewColumn", 1.0), std::logic_error);
    }
    mpiml::barrier();
    if (mpiml::proc_id() == 0) {
        const std::string text = slurp(dir + "/progress.txt");
        std::istringstream lines(text);
        std::string header, row0, row1;
        std::getline(lines, header);
        std::getline(lines, row0);
        std::getline(lines, row1);
        EXPECT_EQ(header,
                  "Epoch\tAverageEpRet\tStdEpRet\tMaxEpRet\tMinEpRet\tLossV\t"
                  "TotalEnvInteracts\tTime");
        EXPECT_EQ(row0, "0\t1.5\t0.0\t1.5\t1.5\t0.25\t4000\t2.0");
        EXPECT_EQ(row1, "1\tnan\tnan\tnan\tnan\t0.25\t8000\t2.0");
        const Progress p = read_progress(dir + "/progress.txt");
        ASSERT_EQ(p.rows.size(), 3u);
        EXPECT_EQ(p.column("AverageEpRet"), 1);
        EXPECT_DOUBLE_EQ(p.rows[2][1], 3.5);
        EXPECT_TRUE(std::isnan(p.rows[1][1]));

        PlotOptions po;
        po.title = "a <test>";
        const std::string svg = learning_curve_svg(p, po);
        EXPECT_NE(svg.find("<svg"), std::string::npos);
        EXPECT_NE(svg.find("a &lt;test&gt;"), std::string::npos);
        EXPECT_NE(svg.find("<polyline"), std::string::npos);
        EXPECT_NE(svg.find("</svg>"), std::string::npos);
        std::filesystem::remove_all(dir);
    }
}

// Each rank logs and saves its own rank, rank 0 first and the others after it:
// a write by any other rank would replace rank 0's content.
TEST(EpochLogger, OtherRanksWriteNothing) {
    const std::string dir = temp_dir("quiet");
    const int rank = mpiml::proc_id();
    const auto write = [&] {
        EpochLogger log(dir);
        log.log_tabular("Rank", static_cast<std::int64_t>(rank));
        log.dump_tabular();
        log.save_text("config.json", "{\"rank\": " + std::to_string(rank) + "}\n");
    };
    if (rank == 0) write();
    mpiml::barrier();
    if (rank != 0) write();
    mpiml::barrier();
    if (rank == 0) {
        EXPECT_EQ(slurp(dir + "/progress.txt"), "Rank\n0\n");
        EXPECT_EQ(slurp(dir + "/config.json"), "{\"rank\": 0}\n");
        std::filesystem::remove_all(dir);
    }
}

TEST(ReadProgress, RejectsRaggedRows) {
    if (mpiml::proc_id() != 0) return;
    const auto path = std::filesystem::temp_directory_path() /
                      ("mpiml_ppo_ragged_" + std::to_string(::getpid()) + ".txt");
    std::ofstream(path) << "A\tB\n1\t2\n3\n";
    EXPECT_THROW(read_progress(path.string()), std::runtime_error);
    std::filesystem::remove(path);
}

// A resumed logger: the file is cut back to the checkpoint's text (rows dumped
// after it dropped), every rank has those rows, and new rows follow them
// without a second header.
TEST(EpochLogger, ResumesFromCheckpointText) {
    const std::string dir = temp_dir("resume");
    std::string at_checkpoint;
    {
        EpochLogger log(dir);
        for (int epoch = 0; epoch < 3; ++epoch) {
            log.log_tabular("Epoch", static_cast<std::int64_t>(epoch));
            log.log_tabular("X", 0.5 * epoch);
            log.dump_tabular();
            if (epoch == 1) at_checkpoint = log.text();
        }
        EXPECT_EQ(log.text(), "Epoch\tX\n0\t0.0\n1\t0.5\n2\t1.0\n");
    }
    mpiml::barrier();
    EXPECT_EQ(at_checkpoint, "Epoch\tX\n0\t0.0\n1\t0.5\n");
    {
        EpochLogger log(dir, "progress.txt", at_checkpoint);
        ASSERT_EQ(log.progress().rows.size(), 2u);
        EXPECT_DOUBLE_EQ(log.progress().rows[1][1], 0.5);
        log.log_tabular("Epoch", static_cast<std::int64_t>(2));
        log.log_tabular("X", 7.25);
        log.dump_tabular();
        EXPECT_THROW(log.log_tabular("NewColumn", 1.0), std::logic_error);
    }
    mpiml::barrier();
    if (mpiml::proc_id() == 0) {
        EXPECT_EQ(slurp(dir + "/progress.txt"), "Epoch\tX\n0\t0.0\n1\t0.5\n2\t7.25\n");
        EXPECT_FALSE(std::filesystem::exists(dir + "/progress.txt.tmp"));
        std::filesystem::remove_all(dir);
    }
}
