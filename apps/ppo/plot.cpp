#include "plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace ppo {

namespace {

/// Tick step of about n ticks over span: 1, 2 or 5 times a power of ten.
double nice_step(double span, int n) {
    const double raw = span / n;
    const double p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0})
        if (raw <= m * p) return m * p;
    return 10.0 * p;
}

std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '<') out += "&lt;";
        else if (c == '>') out += "&gt;";
        else if (c == '&') out += "&amp;";
        else out += c;
    }
    return out;
}

std::string tick_label(double v) {
    if (v != 0 && std::abs(v) >= 1e4) return fmt::format("{:g}k", v / 1000);
    return fmt::format("{:g}", v);
}

}  // namespace

std::string learning_curve_svg(const Progress& progress, const PlotOptions& o) {
    const int xi = progress.column(o.x), yi = progress.column(o.y);
    if (xi < 0 || yi < 0)
        throw std::runtime_error("plot: progress has no column '" + (xi < 0 ? o.x : o.y) + "'");
    const int bi = o.band.empty() ? -1 : progress.column(o.band);

    double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const auto& r : progress.rows) {
        const double x = r[xi], y = r[yi];
        if (std::isnan(x) || std::isnan(y)) continue;
        const double b = bi >= 0 && !std::isnan(r[bi]) ? r[bi] : 0.0;
        x0 = std::min(x0, x), x1 = std::max(x1, x);
        y0 = std::min(y0, y - b), y1 = std::max(y1, y + b);
    }
    if (!(x0 <= x1)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // nothing to draw
    if (x1 == x0) x0 -= 1, x1 += 1;
    if (y1 == y0) y0 -= 1, y1 += 1;
    const double ys = nice_step(y1 - y0, 5), xs = nice_step(x1 - x0, 8);
    y0 = std::floor(y0 / ys) * ys, y1 = std::ceil(y1 / ys) * ys;
    x0 = std::floor(x0 / xs) * xs, x1 = std::ceil(x1 / xs) * xs;

    const double L = 70, R = o.width - 20.0, T = 36, B = o.height - 50.0;
    auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (R - L); };
    auto py = [&](double y) { return B - (y - y0) / (y1 - y0) * (B - T); };

    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
        "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        "<text x=\"{2}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{3}</text>\n",
        o.width, o.height, (L + R) / 2, escape(o.title));
    // Grid and tick labels.
    for (double y = y0; y <= y1 + ys / 2; y += ys)
        s += fmt::format(
            "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
            "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
            L, py(y), R, L - 6, py(y) + 4, tick_label(y));
    for (double x = x0; x <= x1 + xs / 2; x += xs)
        s += fmt::format(
            "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
            "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
            px(x), T, B, B + 16, tick_label(x));
    s += fmt::format(
        "<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" fill=\"none\" stroke=\"black\"/>\n"
        "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\">{6}</text>\n"
        "<text transform=\"translate(16 {7}) rotate(-90)\" text-anchor=\"middle\">{8}</text>\n",
        L, T, R - L, B - T, (L + R) / 2, o.height - 12.0, escape(o.x), (T + B) / 2, escape(o.y));

    if (bi >= 0)
        s += fmt::format(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#555\">shaded: "
            "{} &#177; {}</text>\n",
            R - 6, T + 16, escape(o.y), escape(o.band));
    // Runs of consecutive points with a y value: band polygon, then the line
    // (a lone point gets a dot).
    std::vector<std::vector<const std::vector<double>*>> runs(1);
    for (const auto& r : progress.rows) {
        if (std::isnan(r[xi]) || std::isnan(r[yi])) {
            if (!runs.back().empty()) runs.emplace_back();
        } else {
            runs.back().push_back(&r);
        }
    }
    for (const auto& run : runs) {
        if (run.empty()) continue;
        if (bi >= 0) {
            std::string pts;
            for (const auto* r : run)
                pts += fmt::format("{:.1f},{:.1f} ", px((*r)[xi]),
                                   py((*r)[yi] + (std::isnan((*r)[bi]) ? 0 : (*r)[bi])));
            for (auto it = run.rbegin(); it != run.rend(); ++it)
                pts += fmt::format("{:.1f},{:.1f} ", px((**it)[xi]),
                                   py((**it)[yi] - (std::isnan((**it)[bi]) ? 0 : (**it)[bi])));
            s += "<polygon fill=\"#1f77b4\" fill-opacity=\"0.2\" stroke=\"none\" points=\"" + pts +
                 "\"/>\n";
        }
        if (run.size() == 1)
            s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#1f77b4\"/>\n",
                             px((*run[0])[xi]), py((*run[0])[yi]));
        std::string pts;
        for (const auto* r : run) pts += fmt::format("{:.1f},{:.1f} ", px((*r)[xi]), py((*r)[yi]));
        s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"" + pts +
             "\"/>\n";
    }
    s += "</svg>\n";
    return s;
}

std::string plot_title(const Config& cfg) {
    return fmt::format("{} on {} (seed {}, {} rank{})", cfg.algo == "vpg" ? "VPG" : "PPO",
                       cfg.env, cfg.seed, cfg.num_procs,
                       cfg.num_procs == 1 ? "" : "s");
}

}  // namespace ppo
