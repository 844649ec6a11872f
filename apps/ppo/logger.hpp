// Spinning Up's EpochLogger on mpiml: values stored during an epoch are
// reduced over all ranks with mpi_statistics_scalar; rank 0 alone writes
// progress.txt (tab-separated: a header line, then one line per epoch).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ppo {

/// A progress.txt table: column names and one row of numbers per epoch.
struct Progress {
    std::vector<std::string> headers;
    std::vector<std::vector<double>> rows;
    /// Index of a column, or -1.
    int column(std::string_view name) const;
};

/// Parses a progress.txt ("nan" and empty fields read as NaN). Throws
/// std::runtime_error on a missing file or a row of the wrong width.
Progress read_progress(const std::string& path);
/// The same from the file's text; name appears in errors.
Progress parse_progress(const std::string& text, const std::string& name);

class EpochLogger {
public:
    /// output_dir empty: nothing is written. Only rank 0 creates the folder
    /// and the file; call after MPI is running.
    ///
    /// resumed_text (a run continued from a checkpoint): text() as it was at
    /// the checkpoint. The epochs in it count as dumped, and rank 0 replaces
    /// the file by it (a new file renamed over the old one: rows written
    /// after the checkpoint are dropped) and appends from there.
    explicit EpochLogger(const std::string& output_dir,
                         const std::string& file_name = "progress.txt",
                         const std::string& resumed_text = {});

    /// Appends samples of key for this epoch (local to this rank).
    void store(const std::string& key, double value);
    void store(const std::string& key, std::span<const double> values);

    /// Logs a value as is (every rank should log the same value).
    void log_tabular(const std::string& key, double value);
    void log_tabular(const std::string& key, std::int64_t value);

    /// Collective: logs statistics of key's stored samples pooled over all
    /// ranks: Average<key> and Std<key> (just <key> with average_only), then
    /// Max<key> and Min<key> with with_min_and_max. Ranks without samples are
    /// fine; when no rank has any, the columns are NaN on every rank.
    void log_tabular_stats(const std::string& key, bool with_min_and_max = false,
                           bool average_only = false);

    /// The value logged under column key in the current epoch (NaN if none).
    double get(const std::string& key) const;

    /// Ends the epoch: rank 0 writes the row (and the header the first time)
    /// and flushes; stored samples and logged values are cleared.
    void dump_tabular();

    /// Rank 0: writes text to output_dir/name.
    void save_text(const std::string& name, const std::string& text) const;

    /// Every epoch dumped so far (kept on every rank).
    const Progress& progress() const { return progress_; }
    /// The file's text so far: the header and every row dumped (on every rank).
    const std::string& text() const { return text_; }
    const std::string& output_dir() const { return dir_; }

private:
    struct Value {
        double v;
        bool integral;
    };
    void put(const std::string& key, Value v);

    std::string dir_;
    bool writer_ = false;
    std::ofstream file_;
    std::map<std::string, std::vector<double>> stored_;
    std::vector<std::string> current_keys_;
    std::map<std::string, Value> current_;
    Progress progress_;
    std::string text_;
};

/// Formats a number as Python's str() does for the logged value (so files
/// match Spinning Up's): integers without a point, floats in shortest
/// round-trip form with ".0" when integral, nan, inf.
std::string format_value(double v, bool integral);

}  // namespace ppo
