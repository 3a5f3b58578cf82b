// The report's profile-based sections (report_sections.h).
#include "report/report_sections.h"

#include <filesystem>

#include "fasttrain/error.h"
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
  return not_profiled("step-breakdown", "Step breakdown", "the time per phase and per op");
}

std::string memory_section(const ProfileFiles& profile) {
  if (!profile.memory) return not_profiled("memory", "Memory", "the memory timeline and the peak's holders");
  return not_profiled("memory", "Memory", "the memory timeline and the peak's holders");
}

std::string advisor_section(const std::string&, const ProfileFiles& profile) {
  if (!profile.summary) return not_profiled("advisor", "Advisor", "the advisor's findings");
  return not_profiled("advisor", "Advisor", "the advisor's findings");
}

}  // namespace ft::report
