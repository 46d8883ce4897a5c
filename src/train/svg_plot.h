// Line plots as inline SVG for the HTML run report (report.h): one <svg> element per plot,
// self-contained (no scripts, no external fonts, no network), with a title, axes, "nice"
// tick values (1, 2, 5 x 10^k on linear axes, powers of the base on log axes), grid lines,
// axis labels and, for two or more series, a legend. The element carries a viewBox, so CSS
// can scale it to its container.
//
// Points whose x or y is not finite (or, on a log axis, not positive) are gaps: the line
// breaks there. A series with few points also gets a marker per point, each with a native
// tooltip (<title>). A plot with no plottable point at all says "no data".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rn {

struct PlotSeries {
  std::string label{};           // legend text
  std::vector<double> x{}, y{};  // same length
};

enum class PlotScale { linear, log2, log10 };

struct PlotOptions {
  std::string title{};
  std::string x_label{}, y_label{};
  PlotScale y_scale = PlotScale::linear;
  std::optional<double> y_min{}, y_max{};  // fixed ends of a linear y axis; default: fitted to the data
  int width = 560, height = 320;           // pixels (the viewBox)
};

// One <svg>...</svg> element. Series are drawn in order, each in the next palette colour.
std::string svg_line_plot(const std::vector<PlotSeries>& series, const PlotOptions& options);

// Escapes & < > " ' for HTML and SVG text and attribute values.
std::string html_escape(std::string_view text);

}  // namespace rn
