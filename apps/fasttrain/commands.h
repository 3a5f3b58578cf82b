// Subcommands of the fasttrain program. Each lives in its own file and registers itself:
//   FT_REGISTER_COMMAND(train, "train a model", run_train);
// where run_train(const std::vector<std::string>& args) gets the arguments after the command
// name, returns the exit code, and throws ft::Error for bad input (main prints it, exits 2).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ft::cli {

using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct Command {
  std::string summary;
  CommandFn run;
};

std::map<std::string, Command>& commands();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, CommandFn fn) { commands()[name] = {summary, std::move(fn)}; }
};

}  // namespace ft::cli

#define FT_REGISTER_COMMAND(NAME, SUMMARY, FN) \
  static ::ft::cli::CommandRegistrar ft_command_registrar_##NAME(#NAME, SUMMARY, FN)
// For command names that are not identifiers ("lr-find").
#define FT_REGISTER_COMMAND_NAMED(ID, NAME, SUMMARY, FN) \
  static ::ft::cli::CommandRegistrar ft_command_registrar_##ID(NAME, SUMMARY, FN)
