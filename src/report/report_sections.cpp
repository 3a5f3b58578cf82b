// The report's profile-based sections (report_sections.h).
#include "report/report_sections.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "fasttrain/advisor.h"
#include "fasttrain/error.h"
#include "fasttrain/train.h"
#include "report/svg_plot.h"
#include "train/run_files.h"

namespace ft::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::optional<json> read_optional_json(const std::string& path, const char* what) {
  if (!fs::exists(path)) return std::nullopt;
  try {
    return json::parse(train::read_text(path, what));
  } catch (const json::exception& e) {
    FT_FAIL(path, ": invalid JSON (", what, "): ", e.what());
  }
}

std::string number(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string not_profiled(const char* id, const char* title, const char* what) {
  return std::string("<section id=\"") + id + "\">\n<h2>" + title + "</h2>\n<p>This run was not profiled: " + what +
         " come from <code>fasttrain train --profile START:END</code>.</p>\n</section>\n";
}

}  // namespace

ProfileFiles read_profile_files(const std::string& run_dir) {
  return {read_optional_json(run_dir + "/profile/summary.json", "the profile summary"),
          read_optional_json(run_dir + "/profile/memory.json", "the memory history")};
}

std::string step_breakdown_section(const ProfileFiles& profile) {
  if (!profile.summary) return not_profiled("step-breakdown", "Step breakdown", "the time per phase and per op");
  const json& s = *profile.summary;
  std::string body;
  try {
    const double step_ms = s.at("step_ms").get<double>();
    body += "<p>Steps " + std::to_string(s.at("first_step").get<int64_t>()) + " to " +
            std::to_string(s.at("last_step").get<int64_t>()) + ": " + number(step_ms, "%.3g") + " ms per step, " +
            number(s.at("achieved_gflops").get<double>(), "%.3g") + " GFLOP/s, " +
            number(100 * s.at("fraction_of_peak").get<double>(), "%.1f") + "% of the measured peak (" +
            number(s.at("peak").at("gflops").get<double>(), "%.4g") +
            " GFLOP/s: " + escape_xml(s.at("peak").at("method").get<std::string>()) + ").</p>\n";
    BarChart phases;
    phases.title = "Time per phase (ms per step)";
    phases.unit = "ms";
    for (const auto& [name, ms] : s.at("phase_ms_per_step").items()) phases.bars.emplace_back(name, ms.get<double>());
    std::stable_sort(phases.bars.begin(), phases.bars.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    if (!phases.bars.empty()) body += "<figure>" + bar_chart_svg(phases) + "</figure>\n";
    std::string rows;
    int shown = 0;
    for (const json& op : s.at("ops")) {
      if (++shown > 15) break;
      rows += "<tr><td>" + escape_xml(op.at("name").get<std::string>()) + "</td><td>" +
              number(op.at("calls_per_step").get<double>(), "%.3g") + "</td><td>" +
              number(op.at("self_ms_per_step").get<double>(), "%.3f") + "</td><td>" +
              number(100 * op.at("share_of_step").get<double>(), "%.1f") + "%</td><td>" +
              number(op.at("gflops").get<double>(), "%.3g") + "</td><td>" +
              number(100 * op.at("fraction_of_peak").get<double>(), "%.1f") + "%</td></tr>\n";
    }
    body +=
        "<table class=\"data\"><tr><th>op</th><th>calls/step</th><th>self ms/step</th><th>share</th>"
        "<th>GFLOP/s</th><th>of peak</th></tr>\n" +
        rows + "</table>\n";
  } catch (const json::exception& e) {
    FT_FAIL("report: profile/summary.json: malformed profile summary: ", e.what());
  }
  return "<section id=\"step-breakdown\">\n<h2>Step breakdown</h2>\n" + body + "</section>\n";
}

std::string memory_section(const ProfileFiles& profile) {
  if (!profile.memory)
    return not_profiled("memory", "Memory", "the memory timeline and the peak's holders (with --memory-history)");
  std::string body;
  try {
    const json& m = *profile.memory;
    const json& peak = m.at("peak");
    const double mib = 1048576.0;
    body += "<p>Peak " + number(peak.at("peak_bytes").get<double>() / mib, "%.2f") + " MiB in step " +
            std::to_string(peak.at("peak_step").get<int64_t>()) + ", during " +
            escape_xml(peak.at("peak_phase").get<std::string>()) + " (" +
            escape_xml(peak.at("peak_op").get<std::string>()) + ").</p>\n";
    const json& t = m.at("timeline");
    StackedArea area;
    area.title = "Memory over one step (step " + std::to_string(t.at("step").get<int64_t>()) + ") by category";
    area.x_label = "ms into the step";
    area.y_label = "MiB";
    const std::vector<double> t_us = t.at("t_us").get<std::vector<double>>();
    for (double us : t_us) area.x.push_back((us - t_us.front()) / 1000.0);
    for (const auto& [name, values] : t.at("bytes_by_category").items()) {
      std::vector<double> v;
      for (const json& b : values) v.push_back(b.get<double>() / mib);
      double most = 0;
      for (double x : v) most = std::max(most, x);
      if (most > 0) area.layers.emplace_back(name, std::move(v));
    }
    if (area.x.size() >= 2 && !area.layers.empty()) body += "<figure>" + stacked_area_svg(area) + "</figure>\n";
    BarChart categories;
    categories.title = "At the peak, by category (MiB)";
    categories.unit = "MiB";
    for (const auto& [name, bytes] : peak.at("by_category").items())
      if (bytes.get<int64_t>() > 0) categories.bars.emplace_back(name, bytes.get<double>() / mib);
    std::stable_sort(categories.bars.begin(), categories.bars.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    if (!categories.bars.empty()) body += "<figure>" + bar_chart_svg(categories) + "</figure>\n";
    std::string rows;
    int shown = 0;
    for (const json& holder : peak.at("by_module")) {
      if (++shown > 8) break;
      const std::string module = holder.at("module").get<std::string>();
      rows += "<tr><td>" + escape_xml(module.empty() ? "(outside any module)" : module) + "</td><td>" +
              number(holder.at("bytes").get<double>() / mib, "%.2f") + "</td></tr>\n";
    }
    body += "<table class=\"data\"><tr><th>the peak's top holders</th><th>MiB</th></tr>\n" + rows + "</table>\n";
  } catch (const json::exception& e) {
    FT_FAIL("report: profile/memory.json: malformed memory history: ", e.what());
  }
  return "<section id=\"memory\">\n<h2>Memory</h2>\n" + body + "</section>\n";
}

std::string advisor_section(const std::string& run_dir, const ProfileFiles& profile) {
  if (!profile.summary) return not_profiled("advisor", "Advisor", "the advisor's findings");
  // The Trainer's own findings (they include the rules that look at the model); else the
  // findings the profile summary alone supports.
  const std::string advice = run_dir + "/profile/advice.json";
  std::vector<train::Finding> findings;
  if (fs::exists(advice)) {
    findings = train::findings_from_json(train::read_text(advice, "the advisor's findings"), advice);
  } else {
    train::TrainerConfig config;
    const std::string config_path = run_dir + "/config.toml";
    if (fs::exists(config_path))
      train::apply_toml(config, train::read_text(config_path, "the run's configuration"), config_path);
    findings = train::advise(config, train::measurements_from_profile(run_dir + "/profile/summary.json", config));
  }
  std::string body;
  if (findings.empty()) {
    body = "<p>Nothing to change: no rule's threshold was crossed in the profiled steps.</p>\n";
  } else {
    body = "<ul class=\"findings\">\n";
    for (const train::Finding& f : findings)
      body += "<li><strong>" + escape_xml(f.rule) + "</strong>: " + escape_xml(f.evidence) + ".<br>Change: <code>" +
              escape_xml(f.change) + "</code></li>\n";
    body += "</ul>\n";
  }
  return "<section id=\"advisor\">\n<h2>Advisor</h2>\n" + body + "</section>\n";
}

}  // namespace ft::report
