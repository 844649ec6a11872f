"""Small hand-written SVG charts for BENCHMARKS.md, in the style of
mpiml-ppo's learning curve (apps/ppo/plot.cpp): white page, grey grid, black
frame, 12 px sans-serif. No plotting library.

  lines(title, x_label, y_label, series, ...)   log-log lines (time against size)
  bars(title, x_label, groups, names, ...)      grouped horizontal bars

Every point and bar carries a <title> with its exact value (shown on hover).
"""
import math

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]


def escape(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _head(width, height, title):
    return ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
            'font-family="sans-serif" font-size="12">' % (width, height, width, height),
            '<rect width="100%" height="100%" fill="white"/>',
            '<text x="%.0f" y="22" text-anchor="middle" font-size="14">%s</text>'
            % (width / 2, escape(title))]


def _log_ticks(lo, hi, base):
    """Powers of base covering [lo, hi] (at most about 10 of them)."""
    e0, e1 = math.floor(math.log(lo, base) + 1e-9), math.ceil(math.log(hi, base) - 1e-9)
    step = max(1, math.ceil((e1 - e0) / 10))
    return [base ** e for e in range(e0, e1 + 1, step)]


def _legend(out, names, x, y):
    for i, n in enumerate(names):
        yy = y + 16 * i
        out.append('<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/>'
                   '<text x="%.0f" y="%.0f">%s</text>'
                   % (x, yy, COLORS[i % len(COLORS)], x + 17, yy + 10, escape(n)))


def lines(title, x_label, y_label, series, x_fmt=str, y_fmt=str, x_base=2, y_base=10,
          width=720, height=440):
    """series: [(name, [(x, y), ...])], x and y > 0, both axes logarithmic."""
    pts = [p for _, s in series for p in s if p[0] > 0 and p[1] > 0]
    if not pts:
        return "\n".join(_head(width, height, title) + ["</svg>"]) + "\n"
    xt = _log_ticks(min(p[0] for p in pts), max(p[0] for p in pts), x_base)
    yt = _log_ticks(min(p[1] for p in pts), max(p[1] for p in pts), y_base)
    x0, x1, y0, y1 = math.log(xt[0]), math.log(xt[-1]), math.log(yt[0]), math.log(yt[-1])
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1
    L, R, T, B = 80, width - 20, 36, height - 50

    def px(x):
        return L + (math.log(x) - x0) / (x1 - x0) * (R - L)

    def py(y):
        return B - (math.log(y) - y0) / (y1 - y0) * (B - T)

    out = _head(width, height, title)
    for y in yt:
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                   '<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                   % (L, py(y), R, py(y), L - 6, py(y) + 4, escape(y_fmt(y))))
    for x in xt:
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'
                   '<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                   % (px(x), T, px(x), B, px(x), B + 16, escape(x_fmt(x))))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>'
               % (L, T, R - L, B - T))
    out.append('<text x="%.0f" y="%d" text-anchor="middle">%s</text>'
               % ((L + R) / 2, height - 12, escape(x_label)))
    out.append('<text transform="translate(16 %.0f) rotate(-90)" text-anchor="middle">%s</text>'
               % ((T + B) / 2, escape(y_label)))
    for i, (name, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        s = [p for p in s if p[0] > 0 and p[1] > 0]
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                   % (c, " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in s)))
        for x, y in s:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s, %s: %s</title></circle>'
                       % (px(x), py(y), c, escape(name), escape(x_fmt(x)), escape(y_fmt(y))))
    _legend(out, [n for n, _ in series], L + 10, T + 10)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def bars(title, x_label, groups, names, v_fmt=str, log=True, width=720, tick_fmt=None):
    """groups: [(group label, [value or None per name])]; one horizontal bar
    per name in each group, value on a logarithmic (or linear) axis from the
    left; the value (v_fmt) is written after the bar. tick_fmt labels the
    axis (default v_fmt)."""
    tick_fmt = tick_fmt or v_fmt
    vals = [v for _, vs in groups for v in vs if v]
    bar_h, gap = 14, 12
    rows = sum(len([v for v in vs if v]) for _, vs in groups)
    legend_h = 16 * len(names) + 8
    T = 36 + legend_h
    height = T + rows * bar_h + gap * len(groups) + 50
    L, R = 150, width - 90
    out = _head(width, height, title)
    if not vals:
        return "\n".join(out + ["</svg>"]) + "\n"
    if log:
        ticks = _log_ticks(min(vals) / 1.5, max(vals), 10)
        v0, v1 = math.log(ticks[0]), math.log(ticks[-1])

        def pv(v):
            return L + (math.log(v) - v0) / (v1 - v0) * (R - L)
    else:
        top = max(vals)
        p = 10 ** math.floor(math.log10(top / 5))
        step = next(m * p for m in (1, 2, 5, 10) if top / (m * p) <= 6)
        ticks = [step * i for i in range(int(math.ceil(top / step)) + 1)]

        def pv(v):
            return L + v / ticks[-1] * (R - L)
    B = height - 50
    for t in ticks:
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'
                   '<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                   % (pv(t), T, pv(t), B, pv(t), B + 16, escape(tick_fmt(t))))
    y = T + gap / 2
    for label, vs in groups:
        shown = [(i, v) for i, v in enumerate(vs) if v]
        out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                   % (L - 6, y + len(shown) * bar_h / 2 + 4, escape(label)))
        for i, v in shown:
            w = max(pv(v) - L, 1)
            out.append('<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="%s">'
                       '<title>%s, %s: %s</title></rect>'
                       '<text x="%.1f" y="%.1f" font-size="10">%s</text>'
                       % (L, y, w, bar_h - 2, COLORS[i % len(COLORS)], escape(label),
                          escape(names[i]), escape(v_fmt(v)), L + w + 4, y + 10, escape(v_fmt(v))))
            y += bar_h
        y += gap
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>'
               % (L, T, R - L, B - T))
    out.append('<text x="%.0f" y="%d" text-anchor="middle">%s</text>'
               % ((L + R) / 2, height - 12, escape(x_label)))
    _legend(out, names, L, 36)
    out.append("</svg>")
    return "\n".join(out) + "\n"
