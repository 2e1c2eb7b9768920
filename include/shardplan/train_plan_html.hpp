#pragma once
// A training plan as a picture: one self-contained HTML page (inline CSS and SVG, no scripts,
// nothing fetched), as plan_html.hpp draws a parameter plan.
#include <cstddef>
#include <string>

#include "shardplan/train_plan.hpp"

namespace shardplan {

/// The most points the live-bytes chart draws: a longer step is drawn in as many buckets of
/// consecutive steps, each at the most any of its steps holds (so the peak is never lost).
inline constexpr std::size_t kTrainPlanHtmlMaxPoints = 1500;

/// The plan as one HTML page: a header (model, mesh, rules, the step), the bytes per device
/// (parameters, gradients, optimizer state, batch, the peak and its split) as bars, the live
/// bytes over the traced step (TrainPlan::timeline: forward, backward and update shaded, the peak
/// marked, a table of what is live at it), and with a time (TrainPlan::time) the step's time
/// split: compute, exposed communication by tier, the communication hidden under compute.
/// Every text is HTML-escaped. Thread-safe; does not throw for any plan plan_training returns.
std::string train_plan_html(const TrainPlan& plan);

/// Writes train_plan_html(plan) to the file `path` as write_plan_html does (a hidden temporary
/// beside it, renamed into place once complete, replacing only a regular file). Throws IoError
/// naming the path and the system's reason.
void write_train_plan_html(const std::string& path, const TrainPlan& plan);

}  // namespace shardplan
