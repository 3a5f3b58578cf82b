// Shared option handling of `fasttrain train` and `fasttrain lr-find` (train_options.h).
#include "train_options.h"

#include <algorithm>
#include <sstream>
#include <type_traits>

#include "fasttrain/hf_folder.h"
#include "fasttrain/tasks.h"

using namespace ft::train;

namespace ft::cli {

namespace {

template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, std::string>)
    return v.empty() ? "\"\"" : v;
  else if constexpr (NamedEnum<T>)
    return name_of(v);
  else if constexpr (TextOption<T>)
    return v.text.empty() ? "\"\"" : v.text;
  else if constexpr (std::is_same_v<T, bool>)
    return v ? "true" : "false";
  else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

std::string dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

}  // namespace

void add_train_options(CLI::App& app, TrainOptions& o, bool with_resume) {
  app.add_option("--config", o.config_path,
                 "TOML file with any of the options below (keys with '_'); flags override it")
      ->type_name("FILE");
  if (with_resume)
    app.add_option("--resume", o.resume_dir,
                   "continue exactly from a checkpoint folder (runs/.../checkpoints/step-N), the newest complete "
                   "checkpoint of a "
                   "run folder, or 'last' (of --run-dir, else of the newest run under runs/); its config is the base")
        ->type_name("DIR");

  // One flag per config field; the help shows the char default and, where it differs, the images one.
  const TrainerConfig char_defaults = TrainerConfig::defaults_for("char");
  const TrainerConfig image_defaults = TrainerConfig::defaults_for("images");
  std::vector<std::string> defaults_text;
  // Every schedule kind's parameters have a flag; the run's kind decides which it may use.
  visit_fields(
      image_defaults, [&](const OptionInfo&, const auto& v) { defaults_text.push_back(value_text(v)); },
      ScheduleKinds::Every);
  size_t i = 0;
  visit_fields(
      char_defaults,
      [&](const OptionInfo& option, const auto& v) {
        const std::string name = option.name;
        const char* help = option.help;
        using T = std::decay_t<decltype(v)>;
        std::string text = help, def = value_text(v);
        const bool differs = defaults_text[i] != def && name != "task";
        if (def != "\"\"") text += " (default " + def + (differs ? "; images: " + defaults_text[i] : "") + ")";
        CLI::Option* opt = app.add_option("--" + dashed(name), o.values[name], text);
        opt->type_name(std::is_same_v<T, std::string> || NamedEnum<T> || TextOption<T> ? "TEXT"
                       : std::is_same_v<T, bool>                                       ? "BOOL"
                       : std::is_same_v<T, double>                                     ? "NUM"
                                                                                       : "INT");
        // A bare boolean flag means true (--memory-history); a value still sets it (--tensorboard false).
        if constexpr (std::is_same_v<T, bool>) opt->expected(0, 1)->default_str("true");
        o.options.emplace_back(name, opt);
        ++i;
      },
      ScheduleKinds::Every);
}

TrainerConfig resolve_train_config(const TrainOptions& o) {
  auto given = [&](const std::string& name) {
    for (const auto& [n, opt] : o.options)
      if (n == name) return opt->count() > 0;
    return false;
  };

  // The task decides the defaults: from the flag, else the file, else the checkpoint, else char.
  const std::string file_text =
      o.config_path.empty() ? "" : read_text(o.config_path, ("the config file " + o.config_path).c_str());
  std::string task = "char";
  TrainerConfig base;
  if (!o.resume_dir.empty()) {
    base = load_run_config(o.resume_dir);
    base.run_dir.clear();  // a resumed run writes a new run folder unless --run-dir says otherwise
    task = base.task;
  }
  // What the file sets, told from what it leaves alone by values no config can hold.
  bool file_sets_max_steps = false, file_sets_max_epochs = false;
  if (!file_text.empty()) {
    TrainerConfig probe;
    probe.task.clear();
    probe.max_steps = probe.max_epochs = -1;
    apply_toml(probe, file_text, o.config_path);
    if (!probe.task.empty()) task = probe.task;
    file_sets_max_steps = probe.max_steps != -1;
    file_sets_max_epochs = probe.max_epochs != -1;
  }
  if (given("task")) task = o.values.at("task");
  // The library takes any run name; the command line trains the built-in tasks (tasks.h).
  FT_CHECK(task == "char" || task == "images" || task == "lm" || task == "classify",
           "option task: expected char, images, lm or classify, found '", task, "'");
  TrainerConfig c = o.resume_dir.empty() ? TrainerConfig::defaults_for(task) : base;
  c.task = task;
  if (!file_text.empty()) apply_toml(c, file_text, o.config_path);
  for (const auto& [name, opt] : o.options) {
    if (opt->count() == 0) continue;
    const std::string scope = option_scope(name);
    FT_CHECK(option_applies(name, c.task), "option --", dashed(name), " applies to the ", scope,
             scope.find(',') == std::string::npos ? " task" : " tasks", ", not ", c.task);
    set_field(c, name, o.values.at(name));
  }
  // Epochs alone size the run (Lightning's max_steps=-1): max_steps 0 becomes the steps they take.
  if ((given("max_epochs") || file_sets_max_epochs) && !given("max_steps") && !file_sets_max_steps && c.max_epochs > 0)
    c.max_steps = 0;
  // A Hugging Face folder to start from is the architecture and size (as from_pretrained): the
  // [model] options record it; --context sets the training window (at most its positions).
  if (c.task == "lm" && is_hf_folder(c.model.init_from)) {
    const nn::HfModelConfig h = nn::read_hf_config(c.model.init_from);
    const bool llama = h.type == nn::HfModelType::Llama;
    const char* name = llama ? "llama" : "custom";
    FT_CHECK(!given("model") || c.model.name == name, "option --model: ", c.model.init_from, " holds a ",
             llama ? "Llama" : "GPT-2", "; give --model ", name, " or leave --model out");
    for (const char* size : {"layers", "dim", "heads", "kv_heads", "ffn_dim", "rope_theta"})
      FT_CHECK(!given(size), "option --", dashed(size), ": the model of ", c.model.init_from,
               " has its own size (its config.json)");
    c.model.name = name;
    if (llama) {
      const nn::LlamaConfig& l = h.llama;
      c.model.layers = l.layers, c.model.dim = l.dim, c.model.heads = l.heads, c.model.kv_heads = l.kv_heads;
      c.model.ffn_dim = l.ffn_dim, c.model.rope_theta = l.rope_theta;
      if (!given("context")) c.model.context = std::min<int64_t>(l.context, 2048);
    } else {
      c.model.layers = h.gpt.layers, c.model.dim = h.gpt.dim, c.model.heads = h.gpt.heads;
      if (!given("context")) c.model.context = h.gpt.context;
    }
    return c;
  }
  // lm: a preset model brings its own size; --layers/--dim/--heads/--context size --model custom.
  if (c.task == "lm" && is_gpt_preset(c.model.name)) {
    for (const char* size : {"layers", "dim", "heads", "context"})
      FT_CHECK(!given(size), "option --", size, " sizes --model custom; --model ", c.model.name,
               " has its own size (use --model custom to choose one)");
    set_gpt_preset(c.model);
  }
  // A Llama preset likewise, but --context sets its training window (up to its positions).
  if (c.task == "lm" && is_llama_preset(c.model.name)) {
    for (const char* size : {"layers", "dim", "heads", "kv_heads", "ffn_dim", "rope_theta"})
      FT_CHECK(!given(size), "option --", dashed(size), " sizes --model llama; --model ", c.model.name,
               " has its own size (use --model llama to choose one)");
    set_llama_preset(c.model, /*keep_context=*/given("context"));
  }

  return c;
}

}  // namespace ft::cli
