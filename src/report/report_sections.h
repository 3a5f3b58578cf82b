// The report's sections that read a profiled run (profile/summary.json, profile/memory.json) and
// the advisor's findings; private to src/report.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace ft::report {

// The profiler's outputs of a run folder, each absent when the run did not write it.
struct ProfileFiles {
  std::optional<nlohmann::json> summary;  // profile/summary.json: time per phase, top ops
  std::optional<nlohmann::json> memory;   // profile/memory.json: allocation history, categories
};
ProfileFiles read_profile_files(const std::string& run_dir);

std::string step_breakdown_section(const ProfileFiles& profile);
std::string memory_section(const ProfileFiles& profile);
std::string advisor_section(const std::string& run_dir, const ProfileFiles& profile);

}  // namespace ft::report
