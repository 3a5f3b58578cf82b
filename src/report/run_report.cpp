// The run report (include/fasttrain/report.h): reads a run folder and writes one HTML page whose
// sections each come from one file of the folder, so a section is present exactly when its
// source is (a run that was not profiled says so and how to profile it).
#include "fasttrain/report.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fasttrain/atomic_file.h"
#include "fasttrain/error.h"
#include "fasttrain/lr_finder.h"
#include "report/report_sections.h"
#include "report/svg_plot.h"
#include "train/lr_find_plot.h"
#include "train/run_files.h"

namespace ft::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// metrics.csv as columns: the split of each row and every numeric column (absent values empty).
struct Metrics {
  std::vector<std::string> split;
  std::map<std::string, std::vector<std::optional<double>>> columns;

  // (step, value) of the rows of `split_name` that have `column`.
  std::pair<std::vector<double>, std::vector<double>> series(const std::string& split_name,
                                                             const std::string& column) const {
    std::pair<std::vector<double>, std::vector<double>> out;
    const auto it = columns.find(column);
    if (it == columns.end()) return out;
    const auto& steps = columns.at("step");
    for (size_t i = 0; i < split.size(); ++i)
      if (split[i] == split_name && it->second[i] && steps[i]) {
        out.first.push_back(*steps[i]);
        out.second.push_back(*it->second[i]);
      }
    return out;
  }
};

using XY = std::pair<std::vector<double>, std::vector<double>>;

LinePlot make_plot(std::string title, std::string y_label) {
  LinePlot p;
  p.title = std::move(title);
  p.x_label = "step";
  p.y_label = std::move(y_label);
  return p;
}

void add_series(LinePlot& plot, std::string label, XY xy, std::string color = "", bool dashed = false) {
  Series s;
  s.label = std::move(label);
  s.x = std::move(xy.first);
  s.y = std::move(xy.second);
  s.color = std::move(color);
  s.dashed = dashed;
  plot.series.push_back(std::move(s));
}

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line);
  for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

Metrics read_metrics(const std::string& path) {
  std::istringstream in(train::read_text(path, "the run's metrics"));
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split_commas(line);
  size_t split_column = header.size();
  for (size_t c = 0; c < header.size(); ++c)
    if (header[c] == "split") split_column = c;
  FT_CHECK(split_column < header.size() && header[0] == "step", path,
           ": expected a metrics.csv header starting step,... with a split column, found '", line, "'");
  Metrics m;
  for (size_t c = 0; c < header.size(); ++c)
    if (c != split_column) m.columns[header[c]];
  for (int64_t row = 2; std::getline(in, line); ++row) {
    const std::vector<std::string> cells = split_commas(line);
    FT_CHECK(cells.size() == header.size(), path, ":", row, ": expected ", header.size(), " fields, found ",
             cells.size());
    m.split.push_back(cells[split_column]);
    for (size_t c = 0; c < header.size(); ++c) {
      if (c == split_column) continue;
      std::optional<double> v;
      if (!cells[c].empty()) {
        size_t used = 0;
        try {
          v = std::stod(cells[c], &used);
        } catch (const std::exception&) {
          used = 0;
        }
        FT_CHECK(used == cells[c].size(), path, ":", row, ": column ", header[c], ": expected a number, found '",
                 cells[c], "'");
      }
      m.columns[header[c]].push_back(v);
    }
  }
  return m;
}

json read_json_file(const std::string& path, const char* what) {
  try {
    return json::parse(train::read_text(path, what));
  } catch (const json::exception& e) {
    FT_FAIL(path, ": invalid JSON (", what, "): ", e.what());
  }
}

std::string section(const char* id, const char* title, const std::string& body) {
  return std::string("<section id=\"") + id + "\">\n<h2>" + title + "</h2>\n" + body + "</section>\n";
}

std::string paragraph(const std::string& text) { return "<p>" + escape_xml(text) + "</p>\n"; }

std::string figure(const std::string& svg) { return "<figure>" + svg + "</figure>\n"; }

std::string summary_section(const json& summary, const json& task) {
  std::string rows;
  auto row = [&](const std::string& key, const json& v) {
    std::string text = v.is_string() ? v.get<std::string>() : v.dump();
    if (v.is_number_float()) {  // six significant digits: 0.00607 ms, not 0.006073249999999999
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", v.get<double>());
      text = buf;
    }
    rows += "<tr><th>" + escape_xml(key) + "</th><td>" + escape_xml(text) + "</td></tr>\n";
  };
  for (const char* key : {"task",
                          "model",
                          "parameters",
                          "steps",
                          "seconds",
                          "precision",
                          "threads",
                          "workers",
                          "batch_size",
                          "accumulate",
                          "final_train_loss",
                          "final_val_loss",
                          "final_val_accuracy",
                          "loss_floor",
                          "goal",
                          "items_per_s",
                          "data_wait_ms_per_step",
                          "peak_allocated_bytes",
                          "stopped_early",
                          "interrupted"})
    if (summary.contains(key) && !summary[key].is_null()) row(key, summary[key]);
  if (task.is_object() && task.contains("source")) row("data", task["source"]);
  return section("summary", "Summary", "<table class=\"kv\">\n" + rows + "</table>\n");
}

std::string curves_section(const Metrics& m, const json& summary) {
  std::string body;
  const XY train_loss = m.series("train", "loss"), val_loss = m.series("val", "loss");
  if (train_loss.first.empty() && val_loss.first.empty())
    return section("curves", "Training curves", paragraph("metrics.csv has no rows yet."));
  LinePlot loss = make_plot("Loss", "loss");
  if (summary.contains("loss_floor") && summary["loss_floor"].is_number() && !train_loss.first.empty()) {
    const double floor = summary["loss_floor"].get<double>();
    add_series(loss, "floor", {{train_loss.first.front(), train_loss.first.back()}, {floor, floor}}, "#7f7f7f", true);
  }
  add_series(loss, "train", train_loss);
  if (!val_loss.first.empty()) add_series(loss, "validation", val_loss);
  body += figure(line_plot_svg(loss));

  const XY train_acc = m.series("train", "accuracy"), val_acc = m.series("val", "accuracy");
  if (!train_acc.first.empty() || !val_acc.first.empty()) {
    LinePlot acc = make_plot("Accuracy", "accuracy");
    if (!train_acc.first.empty()) add_series(acc, "train", train_acc);
    if (!val_acc.first.empty()) add_series(acc, "validation", val_acc);
    body += figure(line_plot_svg(acc));
  }
  const std::string unit = summary.value("unit", std::string("items"));
  const struct {
    const char* column;
    std::string title, y_label;
  } singles[] = {{"lr", "Learning rate", "lr"},
                 {"items_per_s", "Throughput", unit + " per second"},
                 {"data_wait_ms", "Waiting for data", "ms per step"}};
  for (const auto& single : singles) {
    XY xy = m.series("train", single.column);
    if (xy.first.empty()) continue;
    LinePlot plot = make_plot(single.title, single.y_label);
    add_series(plot, single.column, std::move(xy));
    body += figure(line_plot_svg(plot));
  }
  return section("curves", "Training curves", body);
}

std::string lr_finder_section(const std::string& run_dir) {
  const std::string path = run_dir + "/lr_find.csv";
  if (!fs::exists(path))
    return section("lr-finder", "Learning-rate finder",
                   paragraph("This run has no LR finder curve (fasttrain lr-find --run-dir writes lr_find.csv)."));
  const train::LrFindResult r = train::read_lr_find_csv(path);
  return section("lr-finder", "Learning-rate finder",
                 figure(line_plot_svg(train::lr_find_plot(r))) +
                     paragraph("Suggested learning rate: " + std::to_string(r.suggestion) + "."));
}

std::string config_section(const std::string& run_dir) {
  const std::string path = run_dir + "/config.toml";
  const std::string text = fs::exists(path) ? train::read_text(path, "the run's configuration") : "";
  return section(
      "config", "Configuration",
      text.empty() ? paragraph("The run folder has no config.toml.") : "<pre>" + escape_xml(text) + "</pre>\n");
}

constexpr const char* kStyle = R"(
body { font-family: sans-serif; font-size: 16px; line-height: 1.45; margin: 0 auto; max-width: 960px;
       padding: 1em 1.5em; color: #222; }
h1 { font-size: 1.7em; } h2 { font-size: 1.3em; border-bottom: 1px solid #ccc; margin-top: 2em; }
figure { margin: 1em 0; } svg { max-width: 100%; height: auto; }
table.kv th { text-align: left; padding-right: 1.5em; font-weight: normal; color: #555; }
table.data { border-collapse: collapse; } table.data td, table.data th { border: 1px solid #ddd; padding: 2px 8px; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 14px; }
ul.findings li { margin-bottom: 0.6em; } code { background: #f0f0f0; padding: 0 3px; }
)";

}  // namespace

std::string write_run_report(const std::string& run_dir, const std::string& output) {
  FT_CHECK(fs::is_directory(run_dir), "report: ", run_dir, ": no such run folder");
  const std::string metrics_path = run_dir + "/metrics.csv";
  FT_CHECK(fs::exists(metrics_path), "report: ", run_dir,
           " is not a run folder (expected metrics.csv, written by fasttrain train, found none)");
  const Metrics metrics = read_metrics(metrics_path);
  const std::string summary_path = run_dir + "/summary.json", task_path = run_dir + "/task.json";
  const json summary = fs::exists(summary_path) ? read_json_file(summary_path, "the run's summary") : json::object();
  const json task = fs::exists(task_path) ? read_json_file(task_path, "the task's description") : json::object();
  const ProfileFiles profile = read_profile_files(run_dir);

  const std::string name = fs::path(run_dir).lexically_normal().filename().string();
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>fasttrain run " +
                     escape_xml(name) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n<h1>Run " +
                     escape_xml(name) + "</h1>\n";
  html += summary_section(summary, task);
  html += curves_section(metrics, summary);
  html += step_breakdown_section(profile);
  html += memory_section(profile);
  html += lr_finder_section(run_dir);
  html += advisor_section(run_dir, profile);
  html += config_section(run_dir);
  html += "</body>\n</html>\n";
  const std::string path = output.empty() ? run_dir + "/report.html" : output;
  write_file_atomically(path, html);
  return path;
}

}  // namespace ft::report
