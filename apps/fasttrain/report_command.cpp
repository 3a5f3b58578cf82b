// `fasttrain report RUN_DIR`: the run's self-contained HTML report (fasttrain/report.h).
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/report.h"

namespace {

int run_report(const std::vector<std::string>& args) {
  CLI::App app(
      "Writes one self-contained HTML page for a run folder: the training curves, the step's time and memory when the "
      "run was profiled (--profile), the LR finder's curve, the advisor's findings and the configuration. The page "
      "needs no network and runs no script.",
      "fasttrain report");
  app.set_help_flag("-h,--help", "show this help");
  std::string dir, output;
  app.add_option("run_dir", dir, "run folder of fasttrain train (metrics.csv, summary.json, config.toml)")
      ->required()
      ->type_name("RUN_DIR");
  app.add_option("--output", output, "where to write the page (default RUN_DIR/report.html)")->type_name("FILE");
  if (!ft::cli::parse_command_line(app, args, "report")) return 0;
  std::printf("report: %s\n", ft::report::write_run_report(dir, output).c_str());
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(report, "write a run's HTML report (curves, profile, memory, advisor, config)", run_report);
