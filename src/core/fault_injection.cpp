// FASTTRAIN_FAULT parsing and the actions (fault_injection.h).
#include "core/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "fasttrain/allocator.h"
#include "fasttrain/error.h"

namespace ft::fault {

namespace detail {
std::atomic<bool> g_armed{false};
}

namespace {

enum class Action { Kill, Term, Int, Stop, Oom };

struct Rule {
  Action action;
  std::string point;
  long long nth;
  long long hits = 0;
};

// Every point the engine marks; a spec naming another is a typo that would otherwise never fire.
const char* const kPoints[] = {
    "data", "forward", "backward", "optimizer", "eval", "checkpoint-file", "checkpoint-commit", "file-rename", "load"};

std::mutex g_mu;
std::vector<Rule> g_rules;

std::vector<Rule> parse(const std::string& spec) {
  std::vector<Rule> rules;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string entry = spec.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t at = entry.find('@');
    FT_CHECK(at != std::string::npos, "FASTTRAIN_FAULT: expected <action>@<point>[:<n>], found '", entry, "'");
    const std::string action = entry.substr(0, at);
    std::string point = entry.substr(at + 1);
    long long nth = 1;
    if (size_t colon = point.find(':'); colon != std::string::npos) {
      const std::string n = point.substr(colon + 1);
      char* end = nullptr;
      nth = std::strtoll(n.c_str(), &end, 10);
      FT_CHECK(!n.empty() && *end == '\0' && nth >= 1, "FASTTRAIN_FAULT: '", entry,
               "': expected a count of at least 1 after ':', found '", n, "'");
      point.resize(colon);
    }
    Rule r{Action::Kill, point, nth};
    if (action == "kill")
      r.action = Action::Kill;
    else if (action == "term")
      r.action = Action::Term;
    else if (action == "int")
      r.action = Action::Int;
    else if (action == "stop")
      r.action = Action::Stop;
    else if (action == "oom")
      r.action = Action::Oom;
    else
      FT_FAIL("FASTTRAIN_FAULT: '", entry, "': unknown action '", action, "' (expected kill, term, int, stop or oom)");
    FT_CHECK(std::find_if(std::begin(kPoints), std::end(kPoints), [&](const char* p) { return point == p; }) !=
                 std::end(kPoints),
             "FASTTRAIN_FAULT: '", entry, "': unknown point '", point,
             "' (expected data, forward, backward, optimizer, eval, checkpoint-file, checkpoint-commit, file-rename "
             "or load)");
    rules.push_back(r);
  }
  return rules;
}

// Read before main(): a malformed spec ends the process at once rather than letting a fault test
// pass because its fault never fired.
const bool g_from_environment = [] {
  const char* spec = std::getenv("FASTTRAIN_FAULT");
  if (spec == nullptr || *spec == '\0') return false;
  if (!FT_FAULT_INJECTION) {
    std::fprintf(stderr,
                 "fasttrain: error: FASTTRAIN_FAULT is set, but this build has no fault points "
                 "(configure with -DFASTTRAIN_FAULT_INJECTION=ON)\n");
    std::_Exit(2);
  }
  try {
    g_rules = parse(spec);
  } catch (const Error& e) {
    std::fprintf(stderr, "fasttrain: error: %s\n", e.what());
    std::_Exit(2);
  }
  detail::g_armed.store(true);
  return true;
}();

const char* action_name(Action a) {
  switch (a) {
    case Action::Kill: return "kill";
    case Action::Term: return "term";
    case Action::Int: return "int";
    case Action::Stop: return "stop";
    case Action::Oom: return "oom";
  }
  return "?";
}

}  // namespace

namespace detail {

void reached(const char* point, const std::string* what) {
  std::vector<Action> fire;
  long long hit = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (Rule& r : g_rules)
      if (r.point == point && ++r.hits == r.nth) {
        fire.push_back(r.action);
        hit = r.hits;
      }
  }
  for (Action a : fire) {
    // stderr is unbuffered: the line is out before the signal lands, so test logs say what happened.
    std::fprintf(stderr, "fasttrain: fault injection: %s at %s #%lld%s%s\n", action_name(a), point, hit,
                 what ? " " : "", what ? what->c_str() : "");
    switch (a) {
      case Action::Kill: ::kill(::getpid(), SIGKILL); break;
      case Action::Term: ::raise(SIGTERM); break;
      case Action::Int: ::raise(SIGINT); break;
      case Action::Stop: ::raise(SIGSTOP); break;
      case Action::Oom: {
        Allocator& cpu = allocator_for(Device::cpu());
        cpu.set_memory_limit(static_cast<size_t>(std::max<int64_t>(1, cpu.stats().allocated_bytes)));
        break;
      }
    }
  }
}

}  // namespace detail

void arm(const std::string& spec) {
  FT_CHECK(FT_FAULT_INJECTION || spec.empty(),
           "fault::arm: this build has no fault points (configure with -DFASTTRAIN_FAULT_INJECTION=ON)");
  std::vector<Rule> rules = parse(spec);
  std::lock_guard<std::mutex> lock(g_mu);
  g_rules = std::move(rules);
  detail::g_armed.store(!g_rules.empty());
}

}  // namespace ft::fault
