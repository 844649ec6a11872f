#include "logger.hpp"

#include <mpiml/collectives.hpp>
#include <mpiml/session.hpp>
#include <mpiml/stats.hpp>

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace ppo {

namespace {
constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();
}

int Progress::column(std::string_view name) const {
    for (std::size_t i = 0; i < headers.size(); ++i)
        if (headers[i] == name) return static_cast<int>(i);
    return -1;
}

Progress read_progress(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::stringstream text;
    text << in.rdbuf();
    return parse_progress(text.str(), path);
}

Progress parse_progress(const std::string& text, const std::string& path) {
    std::istringstream in(text);
    Progress p;
    std::string line;
    auto split = [](const std::string& s) {
        std::vector<std::string> out;
        std::string field;
        std::istringstream ss(s);
        while (std::getline(ss, field, '\t')) out.push_back(field);
        if (!s.empty() && s.back() == '\t') out.emplace_back();
        return out;
    };
    if (!std::getline(in, line)) throw std::runtime_error(path + " is empty");
    p.headers = split(line);
    int lineno = 1;
    while (std::getline(in, line)) {
        ++lineno;
        if (line.empty()) continue;
        auto fields = split(line);
        if (fields.size() != p.headers.size())
            throw std::runtime_error(fmt::format("{}:{}: {} fields, header has {}", path, lineno,
                                                 fields.size(), p.headers.size()));
        std::vector<double> row;
        for (const auto& f : fields) {
            if (f.empty() || f == "nan") {
                row.push_back(nan_v);
                continue;
            }
            std::size_t used = 0;
            double v = std::stod(f, &used);
            if (used != f.size())
                throw std::runtime_error(fmt::format("{}:{}: not a number: '{}'", path, lineno, f));
            row.push_back(v);
        }
        p.rows.push_back(std::move(row));
    }
    return p;
}

std::string format_value(double v, bool integral) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (integral) return fmt::format("{}", static_cast<long long>(v));
    std::string s = fmt::format("{}", v);
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    return s;
}

EpochLogger::EpochLogger(const std::string& output_dir, const std::string& file_name,
                         const std::string& resumed_text)
    : dir_(output_dir) {
    writer_ = !dir_.empty() && mpiml::proc_id() == 0;
    if (!resumed_text.empty()) {
        progress_ = parse_progress(resumed_text, file_name + " in the checkpoint");
        text_ = resumed_text;
    }
    if (writer_) {
        std::filesystem::create_directories(dir_);
        const auto path = std::filesystem::path(dir_) / file_name;
        if (!text_.empty()) {
            auto tmp = path;
            tmp += ".tmp";
            std::ofstream out(tmp, std::ios::trunc);
            out << text_;
            out.close();
            if (!out) throw std::runtime_error("cannot write " + tmp.string());
            std::filesystem::rename(tmp, path);  // the old rows, never half a file
        }
        file_.open(path, text_.empty() ? std::ios::trunc : std::ios::app);
        if (!file_) throw std::runtime_error("cannot write " + path.string());
    }
}

void EpochLogger::store(const std::string& key, double value) { stored_[key].push_back(value); }

void EpochLogger::store(const std::string& key, std::span<const double> values) {
    auto& v = stored_[key];
    v.insert(v.end(), values.begin(), values.end());
}

void EpochLogger::put(const std::string& key, Value v) {
    if (progress_.rows.empty()) {
        if (current_.count(key) == 0) current_keys_.push_back(key);
    } else if (progress_.column(key) < 0) {
        throw std::logic_error("EpochLogger: new column '" + key +
                               "' after the first epoch (progress.txt has a fixed header)");
    }
    current_[key] = v;
}

void EpochLogger::log_tabular(const std::string& key, double value) { put(key, {value, false}); }

void EpochLogger::log_tabular(const std::string& key, std::int64_t value) {
    put(key, {static_cast<double>(value), true});
}

void EpochLogger::log_tabular_stats(const std::string& key, bool with_min_and_max,
                                    bool average_only) {
    const auto it = stored_.find(key);
    const std::vector<double> empty;
    const std::vector<double>& x = it == stored_.end() ? empty : it->second;
    // The total count decides, identically on every rank, whether there is
    // anything to summarize (mpi_statistics_scalar refuses zero samples).
    const auto total = mpiml::mpi_sum(static_cast<std::uint64_t>(x.size()));
    mpiml::Statistics s{nan_v, nan_v, nan_v, nan_v, 0};
    if (total > 0) s = mpiml::mpi_statistics_scalar(x, with_min_and_max);
    put(average_only ? key : "Average" + key, {s.mean, false});
    if (!average_only) put("Std" + key, {s.std, false});
    if (with_min_and_max) {
        put("Max" + key, {s.max, false});
        put("Min" + key, {s.min, false});
    }
}

double EpochLogger::get(const std::string& key) const {
    const auto it = current_.find(key);
    return it == current_.end() ? nan_v : it->second.v;
}

void EpochLogger::dump_tabular() {
    const bool first = progress_.rows.empty();
    if (first) progress_.headers = current_keys_;
    std::vector<double> row;
    std::string line;
    for (std::size_t i = 0; i < progress_.headers.size(); ++i) {
        const auto it = current_.find(progress_.headers[i]);
        const Value v = it == current_.end() ? Value{nan_v, false} : it->second;
        row.push_back(v.v);
        if (i) line += '\t';
        line += it == current_.end() ? "" : format_value(v.v, v.integral);
    }
    progress_.rows.push_back(std::move(row));
    std::string header;
    if (first) {
        for (std::size_t i = 0; i < progress_.headers.size(); ++i)
            header += (i ? "\t" : "") + progress_.headers[i];
        header += '\n';
    }
    line += '\n';
    text_ += header + line;
    if (writer_) {
        file_ << header << line;
        file_.flush();
    }
    current_.clear();
    stored_.clear();
}

void EpochLogger::save_text(const std::string& name, const std::string& text) const {
    if (!writer_) return;
    const auto path = std::filesystem::path(dir_) / name;
    std::ofstream out(path);
    out << text;
    if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace ppo
