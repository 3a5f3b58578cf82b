// TrainerConfig: per-task defaults, validation, and its text forms (flags and TOML), all driven
// by visit_fields() so an option is declared once.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <type_traits>

#include <toml++/toml.h>

#include "fasttrain/optim.h"
#include "fasttrain/train.h"
#include "fasttrain/train_step.h"

namespace ft::train {

namespace {
constexpr NamedValue<Monitor> kMonitors[] = {{Monitor::ValLoss, "val_loss"}, {Monitor::ValAccuracy, "val_accuracy"}};
constexpr NamedValue<BatchSizeSearchMode> kBatchSizeSearches[] = {{BatchSizeSearchMode::Power, "power"},
                                                                  {BatchSizeSearchMode::Binsearch, "binsearch"}};
}  // namespace

std::span<const NamedValue<Monitor>> option_names(Monitor) { return kMonitors; }
std::span<const NamedValue<BatchSizeSearchMode>> option_names(BatchSizeSearchMode) { return kBatchSizeSearches; }

const char* section_name(Section s) {
  switch (s) {
    case Section::Run: return "";
    case Section::Model: return "model";
    case Section::Data: return "data";
    case Section::Optimizer: return "optimizer";
    case Section::Schedule: return "schedule";
    case Section::Precision: return "precision";
    case Section::Checkpoint: return "checkpoint";
    case Section::Dist: return "dist";
    case Section::Profile: return "profile";
  }
  return "?";
}

namespace {

template <class T>
constexpr bool is_field_type_v =
    std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t> || std::is_same_v<T, double> || std::is_same_v<T, bool> ||
    std::is_same_v<T, std::string> || NamedEnum<T> || TextOption<T>;

// The value `text` names for an enum option; otherwise "option <name>: expected ..., found '...'".
template <NamedEnum T>
T parse_option_name(const char* option, const std::string& text) {
  return parse_name<T>(std::string("option ") + option, text);
}

// Shortest decimal that reads back to the same double, always with a '.' or exponent so TOML
// keeps it a float.
std::string format_double(double x) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
  return s;
}

// The tasks an option belongs to: the prefix of its help before ':' when it lists task names.
std::string scope_of(const char* help) {
  const std::string h = help;
  const size_t colon = h.find(':');
  if (colon == std::string::npos) return "";
  const std::string prefix = h.substr(0, colon);
  for (const char* task : {"char", "images", "lm", "classify"})
    if (prefix.rfind(task, 0) == 0) return prefix;
  return "";
}

}  // namespace

std::string option_scope(const std::string& name) {
  std::string scope;
  bool found = false;
  TrainerConfig c;
  visit_fields(
      c,
      [&](const OptionInfo& o, auto&) {
        if (name == o.name) {
          scope = scope_of(o.help);
          found = true;
        }
      },
      ScheduleKinds::Every);
  FT_CHECK(found, "unknown option '", name, "'");
  return scope;
}

bool option_applies(const std::string& name, const std::string& task) {
  const std::string scope = option_scope(name);
  if (scope.empty()) return true;
  size_t begin = 0;
  while (begin <= scope.size()) {
    size_t end = scope.find(", ", begin);
    if (end == std::string::npos) end = scope.size();
    if (scope.compare(begin, end - begin, task) == 0) return true;
    begin = end + 2;
  }
  return false;
}

namespace {

// Pipeline parallelism's own checks, from numbers every rank has (each refuses alike, before any
// communication). The stage count against the blocks is checked where the model is cut.
void check_pipeline_options(const TrainerConfig& c) {
  const int64_t pp = c.dist.pp;
  FT_CHECK(c.dist.pp_layers.layers.empty() || static_cast<int64_t>(c.dist.pp_layers.layers.size()) == pp,
           "option pp_layers: ", c.dist.pp_layers.layers.size(), " stages given ('", c.dist.pp_layers.text,
           "') for pp = ", pp);
  if (pp == 1) return;
  FT_CHECK(c.dist.pp_schedule != dist::PipelineSchedule::OneFOneB || c.accumulate >= pp,
           "option pp_schedule: 1f1b with ", c.accumulate, " micro-batches (accumulate) is fewer than the ", pp,
           " pipeline stages (pp); use accumulate >= ", pp, " or --pp-schedule gpipe");
  FT_CHECK(c.task == "lm" || c.task == "char",
           "option pp: pipeline parallelism is built for the lm and char tasks' "
           "decoders (GPT, Llama), not the ",
           c.task, " task");
}

// fp8-mixed's recipe, and what it is not built for: tensor and pipeline parallelism (their
// linear layers are their own modules, and the pipeline schedule runs the forward itself).
void check_fp8_options(const TrainerConfig& c) {
  const PrecisionOptions& p = c.precision;
  FT_CHECK(p.fp8_amax_history >= 1 && p.fp8_amax_history <= kFp8MaxAmaxHistory,
           "option fp8_amax_history: expected 1 to ", kFp8MaxAmaxHistory, " steps, found ", p.fp8_amax_history);
  FT_CHECK(p.fp8_margin >= 0 && p.fp8_margin <= kFp8MaxMargin, "option fp8_margin: expected 0 to ", kFp8MaxMargin,
           ", found ", p.fp8_margin);
  if (p.mode != Precision::FP8Mixed) return;
  FT_CHECK(c.dist.tp == 1 && c.dist.pp == 1, "option precision: fp8-mixed is not built for tensor or pipeline ",
           "parallelism (found tp = ", c.dist.tp, ", pp = ", c.dist.pp, "); use bf16-mixed there");
}

}  // namespace

void TrainerConfig::validate() const {
  auto check = [](bool ok, const char* name, const char* expected, const auto& found) {
    FT_CHECK(ok, "option ", name, ": expected ", expected, ", found ", found);
  };
  // The name parsers' errors say what was expected and found; here the name came from an option.
  auto check_name = [](const auto& parse, const std::string& value) {
    try {
      parse(value);
    } catch (const Error& e) {
      FT_FAIL("option ", e.what());
    }
  };
  // Names a built-in task for the CLI; for a module of one's own it names the run (runs/<task>-...).
  check(!task.empty() && task.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-.") == std::string::npos, "task",
        "a name of lowercase letters, digits, '_', '-' or '.' (built in: char, images)", "'" + task + "'");
  check(device == "cpu" || device == "cuda" || device.rfind("cuda:", 0) == 0, "device", "cpu, cuda or cuda:N",
        "'" + device + "'");
  check_name([](const std::string& d) { return Device::parse(d); }, device);
  if (device != "cpu") {
    const int index = Device::parse(device).index, found = cuda_device_count();
    check(index < found, "device", "cpu or one of this machine's CUDA devices",
          detail::concat("'", device, "' (", found, " CUDA devices found",
                         cuda_compiled() ? "" : ": this build has no CUDA support", ")"));
  }
  check(max_steps >= 1 || (max_steps == 0 && max_epochs > 0), "max_steps",
        "at least 1 (or 0 with max_epochs: as many steps as the epochs take)", max_steps);
  check(max_epochs >= 0, "max_epochs", "0 (no limit) or more", max_epochs);
  check(eval_every >= 0, "eval_every", "0 (only at the end) or more", eval_every);
  check(eval_batches >= 0, "eval_batches", "0 (the whole validation split) or more", eval_batches);
  check(log_every_n_steps >= 1, "log_every_n_steps", "at least 1", log_every_n_steps);
  check(checkpoint.every >= 0, "checkpoint_every", "0 (none) or more", checkpoint.every);
  check(threads >= 0 && threads <= 1024, "threads", "0 (all cores) to 1024", threads);
  check(workers >= 0 && workers <= 256, "workers", "0 to 256", workers);
  check(prefetch >= 1 && prefetch <= 64, "prefetch", "1 to 64", prefetch);
  check(batch_size >= 0, "batch_size", "at least 1 (or auto)", batch_size);
  check(std::isfinite(optimizer.lr) && optimizer.lr > 0, "lr", "a positive learning rate", optimizer.lr);
  if (const double* min_lr = schedule.min_lr())
    check(std::isfinite(*min_lr) && *min_lr >= 0 && *min_lr <= optimizer.lr, "min_lr", "a value in [0, lr]", *min_lr);
  check(std::isfinite(optimizer.weight_decay) && optimizer.weight_decay >= 0, "weight_decay", "0 or more",
        optimizer.weight_decay);
  check(optimizer.momentum >= 0 && optimizer.momentum < 1, "momentum", "a value in [0, 1)", optimizer.momentum);
  check(optimizer.beta1 >= 0 && optimizer.beta1 < 1, "beta1", "a value in [0, 1)", optimizer.beta1);
  check(optimizer.beta2 >= 0 && optimizer.beta2 < 1, "beta2", "a value in [0, 1)", optimizer.beta2);
  check(std::isfinite(optimizer.trust_coefficient) && optimizer.trust_coefficient > 0, "trust_coefficient",
        "a positive value", optimizer.trust_coefficient);
  check(std::isfinite(optimizer.grad_clip) && optimizer.grad_clip >= 0, "grad_clip", "0 (off) or a positive norm",
        optimizer.grad_clip);
  check(accumulate >= 1 && accumulate <= 1 << 20, "accumulate", "1 or more micro-batches per step", accumulate);
  if (max_steps > 0) {
    make_schedule(*this);  // validates the schedule and its parameters
  } else {                 // sized by epochs: the step count is not known until the loader counts an epoch
    TrainerConfig sized = *this;
    sized.max_steps = 1;  // past the warmup, which the factories check against the steps
    std::visit(
        [&](const auto& k) {
          if constexpr (requires { k.warmup_steps; }) sized.max_steps = std::max<int64_t>(1, k.warmup_steps + 1);
        },
        schedule.params);
    make_schedule(sized);
  }
  check(max_batch_size >= 1, "max_batch_size", "at least 1", max_batch_size);
  check(checkpoint.keep_last >= 0, "keep_last", "0 (all) or more", checkpoint.keep_last);
  check(checkpoint.keep_best >= 0, "keep_best", "0 or more", checkpoint.keep_best);
  // Of the built-in tasks only images measures an accuracy; a module of one's own may report one
  // (its "accuracy" metric) and is not known here.
  FT_CHECK(checkpoint.monitor != Monitor::ValAccuracy || task != "char",
           "option monitor: val_accuracy is measured by the images task and by modules that report an accuracy; "
           "the char task reports val_loss");
  check(checkpoint.early_stopping_patience >= 0, "early_stopping_patience", "0 (off) or more",
        checkpoint.early_stopping_patience);
  check(std::isfinite(checkpoint.early_stopping_min_delta) && checkpoint.early_stopping_min_delta >= 0,
        "early_stopping_min_delta", "0 or more", checkpoint.early_stopping_min_delta);
  // Distributed options (src/train/distributed.cpp applies them).
  check(std::isfinite(dist.bucket_cap_mb) && dist.bucket_cap_mb >= 0, "bucket_cap_mb",
        "0 (one bucket) or a positive size in MiB", dist.bucket_cap_mb);
  check(std::isfinite(dist.timeout) && dist.timeout >= 0, "dist_timeout", "0 (never) or a positive number of seconds",
        dist.timeout);
  check(dist.tp >= 1, "tp", "1 or more tensor-parallel ranks", dist.tp);
  check(dist.pp >= 1, "pp", "1 or more pipeline stages", dist.pp);
  check_pipeline_options(*this);
  check_fp8_options(*this);
}

std::string config_to_toml(const TrainerConfig& c) {
  std::ostringstream os;
  os << "# fasttrain train configuration (every option resolved); usable with --config\n";
  // TOML wants a document's plain keys before its first table: one pass per section.
  for (const Section section : kSections) {
    if (section != Section::Run) os << "\n[" << section_name(section) << "]\n";
    visit_fields(c, [&](const OptionInfo& o, const auto& v) {
      if (o.section != section) return;
      using T = std::decay_t<decltype(v)>;
      static_assert(is_field_type_v<T>);
      os << o.toml_key() << " = ";
      if constexpr (std::is_same_v<T, std::string>)
        os << toml::value<std::string>(v);
      else if constexpr (NamedEnum<T>)
        os << toml::value<std::string>(name_of(v));
      else if constexpr (TextOption<T>)
        os << toml::value<std::string>(v.text);
      else if constexpr (std::is_same_v<T, bool>)
        os << (v ? "true" : "false");
      else if constexpr (std::is_same_v<T, double>)
        os << format_double(v);
      else
        os << v;
      os << "\n";
    });
  }
  return os.str();
}

namespace {

// Sets a text option from its text: the schedule switches kind keeping the parameters both kinds
// have (ScheduleOptions::switch_to); the others are parsed anew.
template <TextOption T>
void assign_text(T& field, const char* name, const std::string& text) {
  if constexpr (requires { field.switch_to(name, text); })
    field.switch_to(name, text);
  else
    field = T::parse(name, text);
}

// A parameter of a schedule kind other than the run's: the error that says so, or nothing when
// `name` is no schedule parameter.
void check_not_other_schedules(const TrainerConfig& c, const std::string& name, const std::string& where) {
  const std::string kinds = schedule_kinds_with(name);
  if (!kinds.empty())
    FT_FAIL(where, ": not a parameter of the ", name_of(c.schedule.kind()), " schedule but of ", kinds,
            " (choose the schedule with --schedule or [schedule] name)");
}

// Sets `field` from a TOML value; `where` names it in errors ("run.toml: key 'data.train'").
template <class T>
void set_from_toml(T& field, const toml::node& node, const std::string& where, const char* name) {
  auto wrong = [&](const char* expected) { FT_FAIL(where, ": expected ", expected, ", found a ", node.type()); };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!node.is_string()) wrong("a string");
    field = *node.template value<std::string>();
  } else if constexpr (TextOption<T>) {
    if (!node.is_string()) wrong("a string");
    try {
      assign_text(field, name, *node.template value<std::string>());
    } catch (const Error& e) {
      FT_FAIL(where, ": ", e.what());
    }
  } else if constexpr (NamedEnum<T>) {
    if (!node.is_string()) wrong(("a string: " + names_list<T>()).c_str());
    try {
      field = parse_option_name<T>(name, *node.template value<std::string>());
    } catch (const Error& e) {
      FT_FAIL(where, ": ", e.what());
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!node.is_boolean()) wrong("true or false");
    field = *node.template value<bool>();
  } else if constexpr (std::is_same_v<T, double>) {
    if (!node.is_number()) wrong("a number");
    field = *node.template value<double>();
  } else {
    if constexpr (std::is_same_v<T, int64_t>) {
      if (std::string(name) == "batch_size" && node.is_string() && *node.template value<std::string>() == "auto") {
        field = 0;  // the batch-size finder
        return;
      }
    }
    if (!node.is_integer()) wrong("an integer");
    const int64_t v = *node.template value<int64_t>();
    if constexpr (std::is_same_v<T, uint64_t>) FT_CHECK(v >= 0, where, ": expected a non-negative integer, found ", v);
    field = static_cast<T>(v);
  }
}

// The table a top-level TOML key names, if it names one.
std::optional<Section> table_named(const std::string& key) {
  for (const Section section : kSections)
    if (section != Section::Run && key == section_name(section)) return section;
  return std::nullopt;
}

std::string table_list() {
  std::string out;
  for (const Section section : kSections)
    if (section != Section::Run) out += std::string(out.empty() ? "" : ", ") + "[" + section_name(section) + "]";
  return out;
}

// Applies one key of a table to the option it names.
void apply_key(TrainerConfig& into, const std::string& k, const toml::node& node, Section section,
               const std::string& source) {
  const std::string where = section == Section::Run ? k : std::string(section_name(section)) + "." + k;
  bool known = false;
  visit_fields(into, [&](const OptionInfo& o, auto& field) {
    const bool match = section == Section::Run ? k == o.name : o.section == section && k == o.toml_key();
    if (!match) return;
    known = true;
    set_from_toml(field, node, source + ": key '" + where + "'", o.name);
  });
  if (known) return;
  // The flat files of earlier runs list every kind's parameters: those of other kinds mean nothing.
  if (section == Section::Run && !schedule_kinds_with(k).empty()) return;
  if (section == Section::Schedule) check_not_other_schedules(into, k, source + ": key '" + where + "'");
  FT_FAIL(source, ": unknown key '", where,
          "' (the keys are the options of fasttrain train --help with '_', in their tables: ", table_list(), ")");
}

// Applies the keys of one table: the top level (Section::Run) or one of the tables. At the top
// level the options of every table are also accepted under their flag names, as the flat
// config.toml of runs before the tables were introduced wrote them, so old checkpoints resume
// (tests/data/checkpoint_8ca1ea0). A top-level key that is also a table's name ("optimizer",
// "schedule", "precision", "profile") is the table when its value is one, the option otherwise.
void apply_table(TrainerConfig& into, const toml::table& table, Section section, const std::string& source) {
  // The schedule's kind first: its parameters are those of the kind, whatever the keys' order.
  const char* kind_key = section == Section::Run ? "schedule" : section == Section::Schedule ? "name" : nullptr;
  const toml::node* kind = kind_key != nullptr ? table.get(kind_key) : nullptr;
  if (kind != nullptr && !kind->is_table()) apply_key(into, kind_key, *kind, section, source);
  for (auto&& [key, entry] : table) {
    const std::string k(key.str());
    const toml::node& node = entry;  // a plain reference: clang 14 cannot capture structured bindings
    if (&node == kind && !node.is_table()) continue;
    if (section == Section::Run && node.is_table()) {
      const std::optional<Section> named = table_named(k);
      FT_CHECK(named.has_value(), source, ": unknown table [", k, "] (the tables are ", table_list(), ")");
      apply_table(into, *node.as_table(), *named, source);
      continue;
    }
    apply_key(into, k, node, section, source);
  }
}
}  // namespace

void apply_toml(TrainerConfig& into, const std::string& text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    FT_FAIL(source, ":", where.line, ":", where.column, ": invalid TOML: ", e.description());
  }
  apply_table(into, table, Section::Run, source);
}

void set_field(TrainerConfig& c, const std::string& key, const std::string& value) {
  bool known = false;
  visit_fields(c, [&](const OptionInfo& o, auto& field) {
    if (key != o.name) return;
    known = true;
    using T = std::decay_t<decltype(field)>;
    auto bad = [&](const char* expected) {
      FT_FAIL("option ", o.name, ": expected ", expected, ", found '", value, "'");
    };
    if constexpr (std::is_same_v<T, int64_t>) {
      if (key == "batch_size" && value == "auto") {  // the batch-size finder
        field = 0;
        return;
      }
    }
    if constexpr (std::is_same_v<T, std::string>) {
      field = value;
    } else if constexpr (TextOption<T>) {
      assign_text(field, o.name, value);
    } else if constexpr (NamedEnum<T>) {
      field = parse_option_name<T>(o.name, value);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (value == "true" || value == "1" || value == "yes" || value == "on")
        field = true;
      else if (value == "false" || value == "0" || value == "no" || value == "off")
        field = false;
      else
        bad("true or false");
    } else if constexpr (std::is_same_v<T, double>) {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0') bad("a number");
      field = v;
    } else {
      char* end = nullptr;
      errno = 0;
      if (value.empty() || (std::is_same_v<T, uint64_t> && value[0] == '-')) bad("a non-negative integer");
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (*end != '\0' || errno == ERANGE) bad("an integer");
      field = static_cast<T>(v);
    }
  });
  if (!known) check_not_other_schedules(c, key, "option " + key);
  FT_CHECK(known, "unknown option '", key, "'");
}

int64_t parse_memory_size(const std::string& text) {
  if (text.empty()) return 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  double unit = 1;
  const std::string suffix = end;
  if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB")
    unit = 1024.0;
  else if (suffix == "M" || suffix == "MB" || suffix == "MiB")
    unit = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GB" || suffix == "GiB")
    unit = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "TB" || suffix == "TiB")
    unit = 1024.0 * 1024 * 1024 * 1024;
  else
    FT_CHECK(suffix.empty(), "option memory_limit: expected a size like 8G, 512M or 1048576, found '", text, "'");
  FT_CHECK(end != text.c_str() && std::isfinite(v) && v > 0 && v * unit < 9.2e18,
           "option memory_limit: expected a positive size like 8G, 512M or 1048576, found '", text, "'");
  return static_cast<int64_t>(v * unit);
}

MemorySize MemorySize::parse(const char*, const std::string& text) { return MemorySize{parse_memory_size(text), text}; }

StepList StepList::parse(const char* option, const std::string& text) {
  StepList out{{}, text};
  std::stringstream in(text);
  for (std::string item; !text.empty() && std::getline(in, item, ',');) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    FT_CHECK(!item.empty() && *end == '\0' && errno == 0, "option ", option,
             ": expected comma-separated steps like 100,200, found '", text, "'");
    out.steps.push_back(v);
  }
  return out;
}

StepRange StepRange::parse(const char* option, const std::string& text) {
  if (text.empty()) return StepRange{};
  const size_t colon = text.find(':');
  auto number = [&](const std::string& part) -> int64_t {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FT_CHECK(used == part.size() && !part.empty() && v >= 1, "option ", option,
             ": expected steps START:END or N (positive step numbers), found '", text, "'");
    return v;
  };
  const int64_t first = number(text.substr(0, colon));
  const int64_t last = colon == std::string::npos ? first : number(text.substr(colon + 1));
  FT_CHECK(last >= first, "option ", option, ": expected START <= END, found '", text, "'");
  return StepRange{first, last, text};
}

StageLayers StageLayers::parse(const char* option, const std::string& text) {
  StageLayers r;
  r.text = text;
  if (text.empty()) return r;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, comma - start);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FT_CHECK(used == part.size() && !part.empty() && v >= 1, "option ", option,
             ": expected positive block counts per stage separated by commas (e.g. 3,3,2), found '", text, "'");
    r.layers.push_back(v);
    start = comma + 1;
  }
  return r;
}

}  // namespace ft::train
