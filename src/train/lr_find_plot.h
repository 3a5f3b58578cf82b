// The LR finder's curve as a plot, shared by lr_find.svg and the run report (private to src/).
#pragma once
#include "fasttrain/lr_finder.h"
#include "report/svg_plot.h"

namespace ft::train {

// Smoothed loss against the lr on a log axis, the suggestion marked; the y axis spans the curve
// before a divergence.
report::LinePlot lr_find_plot(const LrFindResult& result);

}  // namespace ft::train
