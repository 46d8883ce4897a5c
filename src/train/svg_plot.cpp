#include "train/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

namespace rn {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
constexpr int kPaletteSize = static_cast<int>(std::size(kPalette));
// Margins around the plot area, in pixels: room for the title, tick labels and axis labels.
constexpr double kMarginLeft = 66, kMarginRight = 18, kMarginTop = 34, kMarginBottom = 46;
constexpr size_t kMarkerMaxPoints = 40;  // series this short get a marker per point
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Tick {
  double value;       // in data units
  std::string label;  // SVG text content (escaped; may hold a <tspan> superscript)
};

// One axis: the data range it shows and its ticks. Log axes map through log_base.
struct Axis {
  PlotScale scale = PlotScale::linear;
  double lo = 0, hi = 1;  // data units
  std::vector<Tick> ticks;

  double transform(double v) const {
    switch (scale) {
      case PlotScale::log2:
        return std::log2(v);
      case PlotScale::log10:
        return std::log10(v);
      case PlotScale::linear:
        break;
    }
    return v;
  }
  // Position of v in [0, 1] along the axis.
  double fraction(double v) const {
    double a = transform(lo), b = transform(hi);
    return (transform(v) - a) / (b - a);
  }
  bool plottable(double v) const { return std::isfinite(v) && (scale == PlotScale::linear || v > 0); }
};

// 1, 2 or 5 times a power of ten, near `raw`.
double nice_step(double raw) {
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double norm = raw / magnitude;
  double nice = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return nice * magnitude;
}

// A tick value printed with as many decimals as the tick step needs: 0.05 -> "0.05",
// 1e-5 -> "1e-05"; on an axis reaching 10^4 (`largest`) every tick in thousands ("2k"), or
// from 10^6 in millions.
std::string format_linear_tick(double v, double step, double largest) {
  if (std::abs(v) < step * 1e-6) return "0";
  double scale = 1;
  const char* suffix = "";
  if (largest >= 1e6 && step >= 1e5) {
    scale = 1e6, suffix = "M";
  } else if (largest >= 1e4 && step >= 100) {
    scale = 1e3, suffix = "k";
  }
  double s = step / scale;
  int decimals = s >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(s) - 1e-9));
  if (decimals > 4) return fmt::format("{:.2g}", v);
  return fmt::format("{:.{}f}{}", v / scale, decimals, suffix);
}

// b^e, as a plain number when short, else as b with a superscript exponent.
std::string format_power_tick(int base, int e) {
  bool plain = base == 2 ? (e >= -4 && e <= 16) : (e >= -3 && e <= 4);
  if (plain) return fmt::format("{:g}", std::pow(static_cast<double>(base), e));
  return fmt::format("{}<tspan dy=\"-5\" font-size=\"9\">{}</tspan>", base, e);
}

// The axis over [data_lo, data_hi], its low end rounded down to a tick and its high end
// rounded up unless `tight_hi` (the x axis ends where the data ends), fixed ends kept.
Axis make_linear_axis(double data_lo, double data_hi, std::optional<double> fixed_lo, std::optional<double> fixed_hi,
                      bool integer_data, bool tight_hi) {
  Axis axis;
  double lo = fixed_lo.value_or(data_lo), hi = fixed_hi.value_or(data_hi);
  if (!(hi > lo)) {  // one value (or a fixed end above the data): open a window around it
    double pad = lo != 0 ? std::abs(lo) * 0.1 : 1;
    if (integer_data) pad = std::max(pad, 1.0);
    if (!fixed_lo) lo -= pad;
    if (!fixed_hi || !(fixed_hi.value() > lo)) hi = lo + 2 * pad;
    tight_hi = false;
  }
  double step = nice_step((hi - lo) / 5);
  if (integer_data) step = std::max(step, 1.0);
  if (!fixed_lo) lo = std::floor(lo / step + 1e-9) * step;
  if (!fixed_hi && !tight_hi) hi = std::ceil(hi / step - 1e-9) * step;
  axis.lo = lo, axis.hi = hi;
  const double largest = std::max(std::abs(lo), std::abs(hi));
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
    double v = k * step;
    axis.ticks.push_back({v, format_linear_tick(v, step, largest)});
  }
  return axis;
}

Axis make_log_axis(PlotScale scale, double data_lo, double data_hi) {
  Axis axis;
  axis.scale = scale;
  int base = scale == PlotScale::log2 ? 2 : 10;
  int lo_e = static_cast<int>(std::floor(axis.transform(data_lo) + 1e-9));
  int hi_e = static_cast<int>(std::ceil(axis.transform(data_hi) - 1e-9));
  if (hi_e <= lo_e) --lo_e, ++hi_e;  // one value: a decade (or octave) either side
  int stride = std::max(1, (hi_e - lo_e + 5) / 6);
  lo_e = static_cast<int>(std::floor(static_cast<double>(lo_e) / stride)) * stride;
  hi_e = static_cast<int>(std::ceil(static_cast<double>(hi_e) / stride)) * stride;
  axis.lo = std::pow(static_cast<double>(base), lo_e);
  axis.hi = std::pow(static_cast<double>(base), hi_e);
  for (int e = lo_e; e <= hi_e; e += stride)
    axis.ticks.push_back({std::pow(double(base), e), format_power_tick(base, e)});
  return axis;
}

struct Point {
  double x, y;  // pixels; NaN: a gap
  size_t index;
  bool gap() const { return std::isnan(x); }
};

// Keeps at most four points per pixel column (first, lowest, highest, last), so a long
// run's series stays small without hiding spikes.
std::vector<Point> thin_to_pixel_columns(const std::vector<Point>& points) {
  std::vector<Point> out;
  size_t i = 0;
  while (i < points.size()) {
    if (points[i].gap()) {
      out.push_back(points[i++]);
      continue;
    }
    double column = std::floor(points[i].x);
    size_t j = i, low = i, high = i;
    for (; j < points.size() && !points[j].gap() && std::floor(points[j].x) == column; ++j) {
      if (points[j].y > points[low].y) low = j;  // pixel y grows downwards
      if (points[j].y < points[high].y) high = j;
    }
    size_t keep[] = {i, std::min(low, high), std::max(low, high), j - 1};
    for (int k = 0; k < 4; ++k) {
      if (k == 0 || keep[k] != keep[k - 1]) out.push_back(points[keep[k]]);
    }
    i = j;
  }
  return out;
}

struct Frame {
  double x0, y0, x1, y1;  // plot area in pixels; y0 is the top
};

void draw_axes(fmt::memory_buffer& svg, const Frame& f, const Axis& x, const Axis& y) {
  auto out = std::back_inserter(svg);
  for (const Tick& t : x.ticks) {
    double px = f.x0 + x.fraction(t.value) * (f.x1 - f.x0);
    fmt::format_to(out, "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#e6e6e6\"/>", px,
                   f.y0, f.y1);
    fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>", px, f.y1 + 15, t.label);
  }
  for (const Tick& t : y.ticks) {
    double py = f.y1 - y.fraction(t.value) * (f.y1 - f.y0);
    fmt::format_to(out, "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#e6e6e6\"/>", f.x0,
                   py, f.x1);
    fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.32em\" text-anchor=\"end\">{}</text>", f.x0 - 6, py,
                   t.label);
  }
}

// The series in pixels, with NaN points where the line breaks; thinned when long.
std::vector<Point> to_pixels(const Frame& f, const Axis& x, const Axis& y, const PlotSeries& s) {
  std::vector<Point> points;
  size_t n = std::min(s.x.size(), s.y.size());
  points.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!x.plottable(s.x[i]) || !y.plottable(s.y[i])) {
      if (!points.empty() && !points.back().gap()) points.push_back({kNaN, kNaN, i});
      continue;
    }
    double px = f.x0 + std::clamp(x.fraction(s.x[i]), 0.0, 1.0) * (f.x1 - f.x0);
    double py = f.y1 - std::clamp(y.fraction(s.y[i]), 0.0, 1.0) * (f.y1 - f.y0);
    points.push_back({px, py, i});
  }
  if (points.size() > 4 * static_cast<size_t>(f.x1 - f.x0)) points = thin_to_pixel_columns(points);
  return points;
}

void draw_series(fmt::memory_buffer& svg, const std::vector<Point>& points, const PlotSeries& s, const char* color) {
  auto out = std::back_inserter(svg);
  fmt::format_to(out, "<path fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" stroke-linejoin=\"round\" d=\"", color);
  bool pen_down = false;
  size_t drawn = 0;
  for (const Point& p : points) {
    if (p.gap()) {
      pen_down = false;
      continue;
    }
    fmt::format_to(out, "{}{:.1f},{:.1f}", pen_down ? 'L' : 'M', p.x, p.y);
    pen_down = true;
    ++drawn;
  }
  fmt::format_to(out, "\"/>");

  for (size_t k = 0; k < points.size(); ++k) {
    const Point& p = points[k];
    if (p.gap()) continue;
    bool isolated = (k == 0 || points[k - 1].gap()) && (k + 1 == points.size() || points[k + 1].gap());
    if (drawn > kMarkerMaxPoints && !isolated) continue;
    fmt::format_to(
        out, "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"><title>{}{}{:.6g}: {:.6g}</title></circle>", p.x,
        p.y, drawn > kMarkerMaxPoints ? 2 : 3, color, html_escape(s.label), s.label.empty() ? "" : " at ", s.x[p.index],
        s.y[p.index]);
  }
}

// The legend goes in whichever corner of the plot area covers the fewest points.
void draw_legend(fmt::memory_buffer& svg, const Frame& f, const std::vector<PlotSeries>& series,
                 const std::vector<std::vector<Point>>& pixels) {
  auto out = std::back_inserter(svg);
  size_t longest = 0;
  for (const PlotSeries& s : series) longest = std::max(longest, s.label.size());
  const double w = 30 + 6.5 * static_cast<double>(longest), h = 16.0 * static_cast<double>(series.size()) + 6;
  double left = f.x1 - w - 8, top = f.y0 + 8;
  size_t fewest = SIZE_MAX;
  for (double l : {f.x1 - w - 8, f.x0 + 8}) {  // right corners first
    for (double t : {f.y0 + 8, f.y1 - h - 8}) {
      size_t covered = 0;
      for (const auto& points : pixels) {
        for (const Point& p : points)
          covered += !p.gap() && p.x >= l - 4 && p.x <= l + w + 4 && p.y >= t - 4 && p.y <= t + h + 4;
      }
      if (covered < fewest) fewest = covered, left = l, top = t;
    }
  }
  fmt::format_to(out,
                 "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#fff\" "
                 "fill-opacity=\"0.85\" stroke=\"#ccc\"/>",
                 left, top, w, h);
  for (size_t i = 0; i < series.size(); ++i) {
    double cy = top + 11 + 16.0 * static_cast<double>(i);
    const char* color = kPalette[i % kPaletteSize];
    fmt::format_to(out,
                   "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
                   "stroke-width=\"2\"/><text x=\"{4:.1f}\" y=\"{1:.1f}\" dy=\"0.32em\">{5}</text>",
                   left + 6, cy, left + 22, color, left + 26, html_escape(series[i].label));
  }
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string svg_line_plot(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  const double width = options.width, height = options.height;
  const Frame frame{kMarginLeft, kMarginTop, width - kMarginRight, height - kMarginBottom};
  Axis probe;
  probe.scale = options.y_scale;

  // The data's extent over every plottable point.
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  bool x_integer = true;
  for (const PlotSeries& s : series) {
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!std::isfinite(s.x[i]) || !probe.plottable(s.y[i])) continue;
      x_lo = std::min(x_lo, s.x[i]), x_hi = std::max(x_hi, s.x[i]);
      y_lo = std::min(y_lo, s.y[i]), y_hi = std::max(y_hi, s.y[i]);
      x_integer = x_integer && s.x[i] == std::round(s.x[i]);
    }
  }
  const bool has_data = x_lo <= x_hi;

  fmt::memory_buffer svg;
  auto out = std::back_inserter(svg);
  fmt::format_to(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                 "font-family=\"sans-serif\" font-size=\"11\" fill=\"#333\" role=\"img\">",
                 options.width, options.height);
  fmt::format_to(out, "<title>{}</title>", html_escape(options.title));
  fmt::format_to(out, "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>");
  fmt::format_to(out,
                 "<text x=\"{:.1f}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">{}</text>",
                 width / 2, html_escape(options.title));
  if (has_data) {
    Axis x = make_linear_axis(x_lo, x_hi, std::nullopt, std::nullopt, x_integer, /*tight_hi=*/true);
    Axis y = options.y_scale == PlotScale::linear
                 ? make_linear_axis(y_lo, y_hi, options.y_min, options.y_max, /*integer_data=*/false, false)
                 : make_log_axis(options.y_scale, y_lo, y_hi);
    draw_axes(svg, frame, x, y);
    std::vector<std::vector<Point>> pixels;
    for (const PlotSeries& s : series) pixels.push_back(to_pixels(frame, x, y, s));
    for (size_t i = 0; i < series.size(); ++i) draw_series(svg, pixels[i], series[i], kPalette[i % kPaletteSize]);
    if (series.size() >= 2) draw_legend(svg, frame, series, pixels);
  } else {
    fmt::format_to(
        out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"16\" fill=\"#999\">no data</text>",
        (frame.x0 + frame.x1) / 2, (frame.y0 + frame.y1) / 2);
  }
  fmt::format_to(out,
                 "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#999\"/>",
                 frame.x0, frame.y0, frame.x1 - frame.x0, frame.y1 - frame.y0);
  fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>", (frame.x0 + frame.x1) / 2,
                 height - 10, html_escape(options.x_label));
  fmt::format_to(out, "<text transform=\"translate(16 {:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
                 (frame.y0 + frame.y1) / 2, html_escape(options.y_label));
  fmt::format_to(out, "</svg>");
  return fmt::to_string(svg);
}

}  // namespace rn
