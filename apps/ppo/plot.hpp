// A learning-curve plot as a small hand-written SVG.
#pragma once

#include "config.hpp"
#include "logger.hpp"

#include <string>

namespace ppo {

struct PlotOptions {
    std::string title;
    std::string x = "TotalEnvInteracts";
    std::string y = "AverageEpRet";
    std::string band = "StdEpRet";  ///< y +- band is shaded (empty or missing: none)
    int width = 640, height = 400;
};

/// The curve y(x) from a progress table, with axes, ticks and labels.
/// Points with NaN y are skipped (the line breaks there). Throws
/// std::runtime_error when x or y is not a column.
std::string learning_curve_svg(const Progress& progress, const PlotOptions& opts);

/// "PPO on <env> (seed S, N ranks)".
std::string plot_title(const Config& cfg);

}  // namespace ppo
