// Hugging Face model folders (hf_folder.h): config.json in transformers' field names, weights as
// model.safetensors or shards with model.safetensors.index.json. The Llama family's state_dict names
// are already LlamaForCausalLM's, so its weights pass through as they are; GPT-2 converts through
// gpt2_from_hf_state / gpt2_to_hf_state (Conv1D layout, vocabulary padding).
#include "fasttrain/hf_folder.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "fasttrain/atomic_file.h"
#include "fasttrain/autograd.h"
#include "fasttrain/error.h"
#include "fasttrain/tensor_parallel.h"

namespace ft::nn {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kWeightsFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string path_in(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), path, ": cannot read the file (", std::strerror(errno), ")");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    json doc = json::parse(text.str());
    FT_CHECK(doc.is_object(), path, ": expected a JSON object, found ", doc.type_name());
    return doc;
  } catch (const json::exception& e) {
    FT_FAIL(path, ": not valid JSON: ", e.what());
  }
}

// config.json's fields with transformers' defaults for the optional ones; every error names the
// file, the field and the value found. A null field counts as absent, as in transformers.
class ConfigFields {
 public:
  ConfigFields(json doc, std::string path) : doc_(std::move(doc)), path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  bool has(const char* key) const { return doc_.contains(key) && !doc_[key].is_null(); }
  const json& at(const char* key) const { return doc_.at(key); }
  int64_t integer(const char* key) const {
    FT_CHECK(has(key), path_, ": field \"", key, "\" is missing");
    const json& v = doc_[key];
    FT_CHECK(v.is_number_integer(), path_, ": field \"", key, "\" must be an integer, found ", v.dump());
    return v.get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t otherwise) const { return has(key) ? integer(key) : otherwise; }
  double number_or(const char* key, double otherwise) const {
    if (!has(key)) return otherwise;
    FT_CHECK(doc_[key].is_number(), path_, ": field \"", key, "\" must be a number, found ", doc_[key].dump());
    return doc_[key].get<double>();
  }
  bool boolean_or(const char* key, bool otherwise) const {
    if (!has(key)) return otherwise;
    FT_CHECK(doc_[key].is_boolean(), path_, ": field \"", key, "\" must be true or false, found ", doc_[key].dump());
    return doc_[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& otherwise) const {
    if (!has(key)) return otherwise;
    FT_CHECK(doc_[key].is_string(), path_, ": field \"", key, "\" must be a string, found ", doc_[key].dump());
    return doc_[key].get<std::string>();
  }
  [[noreturn]] void refuse(const std::string& key, const json& value, const std::string& why) const {
    FT_FAIL(path_, ": field \"", key, "\" is ", value.dump(), ", which fasttrain does not support: ", why);
  }
  void require_string(const char* key, const std::string& supported, const std::string& otherwise) const {
    const std::string v = string_or(key, otherwise);
    if (v != supported) refuse(key, v, "expected \"" + supported + "\"");
  }

 private:
  json doc_;
  std::string path_;
};

// rope_scaling: null, {"rope_type" (or the older "type"): "default"}, or Llama 3's parameters.
RopeScaling rope_scaling_from(const ConfigFields& f) {
  if (!f.has("rope_scaling")) return {};
  const json& s = f.at("rope_scaling");
  if (!s.is_object()) f.refuse("rope_scaling", s, "expected null or an object");
  const char* type_key = s.contains("rope_type") ? "rope_type" : "type";
  const json type = s.value(type_key, json());
  if (type == "default") return {};
  if (type != "llama3")
    f.refuse(std::string("rope_scaling.") + type_key, type, "the supported rope_scaling type is \"llama3\"");
  ConfigFields p(s, f.path() + " (rope_scaling)");
  RopeScaling r;
  r.type = RopeScaling::Type::Llama3;
  r.factor = p.number_or("factor", NAN);
  r.low_freq_factor = p.number_or("low_freq_factor", NAN);
  r.high_freq_factor = p.number_or("high_freq_factor", NAN);
  r.original_max_position_embeddings = p.integer("original_max_position_embeddings");
  auto required = [&](const char* key, double v) {
    FT_CHECK(std::isfinite(v), f.path(), ": field \"rope_scaling.", key, "\" is missing (llama3 needs it)");
  };
  required("factor", r.factor), required("low_freq_factor", r.low_freq_factor);
  required("high_freq_factor", r.high_freq_factor);
  return r;
}

// LlamaConfig (model_type "llama") and Qwen2Config ("qwen2": q/k/v biases, optional sliding window).
LlamaConfig llama_config_from(const ConfigFields& f, const std::string& model_type) {
  f.require_string("hidden_act", "silu", "silu");
  if (f.boolean_or("mlp_bias", false)) f.refuse("mlp_bias", true, "the gated MLP has no biases");
  if (f.number_or("attention_dropout", 0.0) != 0.0)
    f.refuse("attention_dropout", f.at("attention_dropout"), "attention has no dropout");
  LlamaConfig c;
  c.vocab_size = f.integer("vocab_size");
  c.context = f.integer("max_position_embeddings");
  c.layers = f.integer("num_hidden_layers");
  c.dim = f.integer("hidden_size");
  c.heads = f.integer("num_attention_heads");
  c.kv_heads = f.integer_or("num_key_value_heads", c.heads);
  c.head_dim = f.integer_or("head_dim", 0);
  if (c.heads > 0 && c.head_dim * c.heads == c.dim) c.head_dim = 0;  // the default, as the presets hold it
  c.ffn_dim = f.integer("intermediate_size");
  c.rope_theta = f.number_or("rope_theta", 10000.0);
  c.rope_scaling = rope_scaling_from(f);
  c.rms_eps = f.number_or("rms_norm_eps", 1e-6);  // both configs' default
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", false);
  c.init_std = f.number_or("initializer_range", 0.02);
  if (model_type == "qwen2") {
    if (f.boolean_or("use_sliding_window", false))
      f.refuse("use_sliding_window", true, "attention is causal over the whole context (no sliding window)");
    c.attention_bias = true;  // Qwen2's q, k and v projections always have biases
  } else if (f.boolean_or("attention_bias", false)) {
    f.refuse("attention_bias", true,
             "LlamaConfig's attention_bias also puts a bias on o_proj, which nn::Llama lacks (its q/k/v biases "
             "are Qwen2's: model_type \"qwen2\")");
  }
  try {
    c.validate();
  } catch (const Error& e) {
    FT_FAIL(f.path(), ": ", e.what());
  }
  return c;
}

GPTConfig gpt2_config_from(const ConfigFields& f) {
  f.require_string("activation_function", "gelu_new", "gelu_new");
  const double eps = f.number_or("layer_norm_epsilon", 1e-5);
  if (eps != 1e-5) f.refuse("layer_norm_epsilon", eps, "GPT's LayerNorms use 1e-5");
  if (!f.boolean_or("scale_attn_weights", true)) f.refuse("scale_attn_weights", false, "attention scales by 1/sqrt(d)");
  if (f.boolean_or("scale_attn_by_inverse_layer_idx", false))
    f.refuse("scale_attn_by_inverse_layer_idx", true, "attention scales by 1/sqrt(d) only");
  if (f.boolean_or("add_cross_attention", false)) f.refuse("add_cross_attention", true, "GPT is decoder-only");
  if (!f.boolean_or("tie_word_embeddings", true)) f.refuse("tie_word_embeddings", false, "GPT ties its head");
  GPTConfig c;
  c.vocab_size = f.integer("vocab_size");
  c.context = f.has("n_positions") ? f.integer("n_positions") : f.integer("n_ctx");
  c.layers = f.integer("n_layer");
  c.dim = f.integer("n_embd");
  c.heads = f.integer("n_head");
  if (f.has("n_inner") && f.integer("n_inner") != 4 * c.dim)
    f.refuse("n_inner", f.at("n_inner"), "the MLP's width is 4 n_embd (n_inner null)");
  c.dropout = 0.0;  // the *_pdrop fields are a training choice, not the model's shape
  return c;
}

// --- comparing a folder's config with a model's ---

class Differences {
 public:
  template <class T>
  void field(const char* name, const T& in_file, const T& in_model) {
    if (in_file != in_model)
      list_ +=
          detail::concat(list_.empty() ? "" : "; ", name, " ", in_file, " in the file, ", in_model, " in the model");
  }
  struct Sizes {
    const char* name;
    int64_t in_file, in_model;
  };
  void sizes(std::initializer_list<Sizes> list) {
    for (const Sizes& s : list) field(s.name, s.in_file, s.in_model);
  }
  void check(const std::string& path) const { FT_CHECK(list_.empty(), path, " does not describe this model: ", list_); }

 private:
  std::string list_;
};

void check_same(const LlamaConfig& file, const LlamaConfig& model, const std::string& path) {
  Differences d;
  d.sizes({{"vocab_size", file.vocab_size, model.vocab_size},
           {"max_position_embeddings", file.context, model.context},
           {"num_hidden_layers", file.layers, model.layers},
           {"hidden_size", file.dim, model.dim},
           {"num_attention_heads", file.heads, model.heads},
           {"num_key_value_heads", file.kv_heads, model.kv_heads},
           {"head_dim", file.head_size(), model.head_size()},
           {"intermediate_size", file.ffn_dim, model.ffn_dim}});
  d.field("rope_theta", file.rope_theta, model.rope_theta);
  d.field("rms_norm_eps", file.rms_eps, model.rms_eps);
  d.field("tie_word_embeddings", file.tie_embeddings, model.tie_embeddings);
  d.field("attention_bias (q/k/v)", file.attention_bias, model.attention_bias);
  const RopeScaling &a = file.rope_scaling, &b = model.rope_scaling;
  auto type = [](const RopeScaling& r) { return std::string(r.type == RopeScaling::Type::Llama3 ? "llama3" : "null"); };
  d.field("rope_scaling", type(a), type(b));
  if (a.type == b.type && a.type == RopeScaling::Type::Llama3) {
    d.field("rope_scaling.factor", a.factor, b.factor);
    d.field("rope_scaling.low_freq_factor", a.low_freq_factor, b.low_freq_factor);
    d.field("rope_scaling.high_freq_factor", a.high_freq_factor, b.high_freq_factor);
    d.field("rope_scaling.original_max_position_embeddings", a.original_max_position_embeddings,
            b.original_max_position_embeddings);
  }
  d.check(path);
}

// GPTConfig's shape fields under GPT2Config's names.
constexpr std::pair<const char*, int64_t GPTConfig::*> kGpt2Sizes[] = {{"vocab_size", &GPTConfig::vocab_size},
                                                                       {"n_positions", &GPTConfig::context},
                                                                       {"n_layer", &GPTConfig::layers},
                                                                       {"n_embd", &GPTConfig::dim},
                                                                       {"n_head", &GPTConfig::heads}};

void check_same(const GPTConfig& file, const GPTConfig& model, const std::string& path) {
  Differences d;
  for (auto [name, size] : kGpt2Sizes) d.field(name, file.*size, model.*size);
  d.check(path);
}

const char* type_name(HfModelType t) { return t == HfModelType::Llama ? "a Llama-family" : "a GPT-2"; }

HfModelConfig config_of_type(const std::string& dir, HfModelType wanted) {
  HfModelConfig c = read_hf_config(dir);
  FT_CHECK(c.type == wanted, path_in(dir, kConfigFile), ": describes ", type_name(c.type), " model, but the model is ",
           type_name(wanted), " model");
  return c;
}

// --- reading weights ---

// The index's weight_map as file -> names in it, each file a plain name inside the folder.
std::map<std::string, std::vector<std::string>> shards_of_index(const std::string& index_path) {
  const json doc = read_json(index_path);
  const json map = doc.value("weight_map", json());
  FT_CHECK(map.is_object() && !map.empty(), index_path,
           ": \"weight_map\" must be a non-empty object of tensor name -> shard file, found ",
           map.dump().substr(0, 200));
  std::map<std::string, std::vector<std::string>> files;
  for (auto& [name, file] : map.items()) {
    FT_CHECK(file.is_string(), index_path, ": weight_map[\"", name, "\"] must be a file name, found ", file.dump());
    const std::string f = file.get<std::string>();
    FT_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "..", index_path, ": weight_map[\"", name,
             "\"] must name a file in the folder, found \"", f, "\"");
    files[f].push_back(name);
  }
  return files;
}

TensorMap read_shards(const std::string& dir) {
  const std::string index_path = path_in(dir, kIndexFile);
  const auto files = shards_of_index(index_path);
  std::map<std::string, std::string> found_in;  // tensor -> the shard holding it
  TensorMap out;
  for (auto& [file, listed] : files) {
    const std::string shard = path_in(dir, file);
    FT_CHECK(fs::exists(shard), index_path, ": weight_map lists \"", file, "\" (for \"", listed.front(),
             "\"), which is missing from ", dir);
    const SafetensorsFile loaded = load_safetensors(shard);
    for (auto& [name, t] : loaded.tensors) {
      auto [at, fresh] = found_in.emplace(name, file);
      FT_CHECK(fresh, index_path, ": tensor \"", name, "\" is in two shards, ", at->second, " and ", file);
      FT_CHECK(std::find(listed.begin(), listed.end(), name) != listed.end(), index_path, ": tensor \"", name,
               "\" is in ", file, ", but weight_map does not put it there");
      out.emplace_back(name, t);
    }
  }
  for (auto& [file, listed] : files)
    for (auto& name : listed)
      FT_CHECK(found_in.count(name), index_path, ": weight_map puts \"", name, "\" in ", file, ", which lacks it");
  return out;
}

Tensor* find(TensorMap& m, const std::string& name) {
  for (auto& [n, t] : m)
    if (n == name) return &t;
  return nullptr;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// A tied model lists the head under "lm_head.weight" too; save_pretrained leaves it out.
void complete_tied_head(TensorMap& w, const std::string& dir) {
  const Tensor* embed = find(w, "model.embed_tokens.weight");
  if (!embed) return;  // load_state_dict names what is missing
  if (Tensor* head = find(w, "lm_head.weight")) {
    FT_CHECK(bitwise_equal(*head, *embed), dir, ": \"lm_head.weight\" differs from \"model.embed_tokens.weight\", but ",
             "the model ties them (tie_word_embeddings true)");
    return;
  }
  w.emplace_back("lm_head.weight", *embed);
}

// --- writing ---

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: FT_FAIL("save_hf_folder: dtype must be f32, bf16 or f16, found ", dtype_name(t));
  }
}

json common_config(const HfSaveOptions& o) {
  json c;
  c["torch_dtype"] = torch_dtype_name(o.dtype);
  c["use_cache"] = true;
  if (o.bos_token_id) c["bos_token_id"] = *o.bos_token_id;
  if (o.eos_token_id) c["eos_token_id"] = *o.eos_token_id;
  return c;
}

json llama_config_json(const LlamaConfig& m, const HfSaveOptions& o) {
  json c = common_config(o);
  // q/k/v biases without one on o_proj exist in transformers as Qwen2 only.
  const bool qwen2 = m.attention_bias;
  c["architectures"] = {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  c["model_type"] = qwen2 ? "qwen2" : "llama";
  c["vocab_size"] = m.vocab_size, c["max_position_embeddings"] = m.context;
  c["num_hidden_layers"] = m.layers, c["hidden_size"] = m.dim, c["intermediate_size"] = m.ffn_dim;
  c["num_attention_heads"] = m.heads, c["num_key_value_heads"] = m.kv_heads, c["head_dim"] = m.head_size();
  c["hidden_act"] = "silu", c["rms_norm_eps"] = m.rms_eps, c["rope_theta"] = m.rope_theta;
  c["tie_word_embeddings"] = m.tie_embeddings, c["initializer_range"] = m.init_std;
  c["attention_dropout"] = 0.0;
  c["rope_scaling"] = nullptr;
  if (m.rope_scaling.type == RopeScaling::Type::Llama3) {
    const RopeScaling& r = m.rope_scaling;
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  if (qwen2) {
    c["use_sliding_window"] = false, c["sliding_window"] = nullptr, c["max_window_layers"] = m.layers;
  } else {
    c["attention_bias"] = false, c["mlp_bias"] = false, c["pretraining_tp"] = 1;
  }
  return c;
}

json gpt2_config_json(const GPTConfig& m, const HfSaveOptions& o) {
  json c = common_config(o);
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  c["vocab_size"] = m.vocab_size, c["n_positions"] = m.context, c["n_layer"] = m.layers;
  c["n_embd"] = m.dim, c["n_head"] = m.heads, c["n_inner"] = nullptr;
  c["activation_function"] = "gelu_new", c["layer_norm_epsilon"] = 1e-5, c["initializer_range"] = 0.02;
  c["resid_pdrop"] = m.dropout, c["embd_pdrop"] = m.dropout, c["attn_pdrop"] = m.dropout;
  c["scale_attn_weights"] = true, c["tie_word_embeddings"] = true;
  return c;
}

// Hugging Face's order of a Llama decoder layer's modules (self_attn, mlp, input_layernorm,
// post_attention_layernorm), which decides where save_pretrained cuts shards; ours puts the norms
// beside what they feed.
int hf_rank(const std::string& name) {
  if (name.find(".self_attn.") != std::string::npos) return 0;
  if (name.find(".mlp.") != std::string::npos) return 1;
  if (name.find(".input_layernorm.") != std::string::npos) return 2;
  if (name.find(".post_attention_layernorm.") != std::string::npos) return 3;
  return 0;
}

// Each layer's tensors stay where the layer starts; inside it they follow hf_rank.
TensorMap in_hf_layer_order(const TensorMap& state) {
  std::map<std::string, size_t> layer_start;
  std::vector<std::pair<std::pair<size_t, int>, size_t>> keys;  // ((group position, rank), index)
  for (size_t i = 0; i < state.size(); ++i) {
    const std::string& name = state[i].first;
    const size_t at = name.find(".layers.");
    const std::string layer = at == std::string::npos ? name : name.substr(0, name.find('.', at + 8));
    const size_t start = layer_start.emplace(layer, i).first->second;
    keys.push_back({{start, hf_rank(name)}, i});
  }
  std::stable_sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  TensorMap out;
  for (auto& k : keys) out.push_back(state[k.second]);
  return out;
}

// save_pretrained's split: tensors in order; one past the limit starts a new shard, one larger than
// the limit gets a shard of its own (placed where it was met).
std::vector<TensorMap> split_into_shards(const TensorMap& state, int64_t max_bytes) {
  std::vector<TensorMap> shards;
  TensorMap current;
  int64_t current_bytes = 0;
  for (auto& entry : state) {
    const int64_t bytes = static_cast<int64_t>(entry.second.nbytes());
    if (bytes > max_bytes) {
      shards.push_back({entry});
      continue;
    }
    if (current_bytes + bytes > max_bytes) {
      shards.push_back(std::move(current));
      current = {}, current_bytes = 0;
    }
    current.push_back(entry);
    current_bytes += bytes;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_name(size_t i, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return name;
}

void write_weights(const std::string& dir, const TensorMap& state, int64_t max_bytes) {
  // transformers refuses safetensors files whose metadata lacks format "pt".
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  const std::vector<TensorMap> shards = split_into_shards(state, max_bytes);
  if (shards.size() <= 1) return save_safetensors(path_in(dir, kWeightsFile), state, metadata);
  json index;
  int64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shard_name(i, shards.size());
    save_safetensors(path_in(dir, file), shards[i], metadata);
    for (auto& [name, t] : shards[i]) {
      index["weight_map"][name] = file;
      total += static_cast<int64_t>(t.nbytes());
    }
  }
  index["metadata"]["total_size"] = total;
  write_file_atomically(path_in(dir, kIndexFile), index.dump(2) + "\n");
}

// The weights converted to the saved dtype, on the CPU.
TensorMap converted(const TensorMap& state, DType dtype) {
  torch_dtype_name(dtype);  // refuses other dtypes
  TensorMap out;
  for (auto& [name, t] : state) out.emplace_back(name, t.to(Device::cpu(), dtype).contiguous());
  return out;
}

// Removes the temporary folder unless it was renamed into place.
struct TemporaryFolder {
  std::string path;
  bool committed = false;
  ~TemporaryFolder() {
    std::error_code ec;
    if (!committed) fs::remove_all(path, ec);
  }
};

void write_folder(const std::string& dir, const json& config, const TensorMap& state, const HfSaveOptions& o) {
  FT_CHECK(o.max_shard_bytes > 0, "save_hf_folder: max_shard_bytes must be positive, found ", o.max_shard_bytes);
  std::string final_dir = fs::path(dir).lexically_normal().string();
  while (final_dir.size() > 1 && final_dir.back() == '/') final_dir.pop_back();
  const fs::path parent = fs::path(final_dir).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  TemporaryFolder tmp{final_dir + ".tmp." + std::to_string(::getpid())};
  fs::remove_all(tmp.path, ec);
  fs::create_directories(tmp.path, ec);
  FT_CHECK(!ec, tmp.path, ": cannot create the folder: ", ec.message());
  write_file_atomically(path_in(tmp.path, kConfigFile), config.dump(2) + "\n");
  write_weights(tmp.path, converted(state, o.dtype), o.max_shard_bytes);
  replace_folder(tmp.path, final_dir);
  tmp.committed = true;
}

}  // namespace

HfModelConfig read_hf_config(const std::string& dir) {
  const std::string path = path_in(dir, kConfigFile);
  const ConfigFields f(read_json(path), path);
  FT_CHECK(f.has("model_type"), path, ": field \"model_type\" is missing");
  const std::string type = f.string_or("model_type", "");
  HfModelConfig c;
  if (type == "llama" || type == "qwen2") {
    c.type = HfModelType::Llama, c.llama = llama_config_from(f, type);
  } else if (type == "gpt2") {
    c.type = HfModelType::Gpt2, c.gpt = gpt2_config_from(f);
  } else {
    f.refuse("model_type", type, "supported are \"llama\", \"qwen2\" (without a sliding window) and \"gpt2\"");
  }
  return c;
}

TensorMap read_hf_weights(const std::string& dir) {
  // from_pretrained's order of preference: the single file, then the index.
  const std::string single = path_in(dir, kWeightsFile);
  if (fs::exists(single)) return load_safetensors(single).tensors;
  FT_CHECK(fs::exists(path_in(dir, kIndexFile)), dir, ": no ", kWeightsFile, " or ", kIndexFile,
           fs::exists(path_in(dir, "pytorch_model.bin")) ? " (pytorch_model.bin is not read: convert it to safetensors)"
                                                         : "");
  return read_shards(dir);
}

// Weights in Hugging Face's names into a Llama; `source` (a folder or a file) names errors.
void load_llama_state(Llama& model, TensorMap w, const std::string& source) {
  // Older checkpoints saved the rotary inverse frequencies as buffers; they follow from the config.
  std::erase_if(w, [](const auto& e) { return e.first.ends_with(".rotary_emb.inv_freq"); });
  if (model.config().tie_embeddings) complete_tied_head(w, source);
  try {
    model.load_state_dict(dist::shard_tensor_parallel_state(w, model));  // a split model: its parts
  } catch (const Error& e) {
    FT_FAIL(source, ": ", e.what());
  }
}

void load_hf_folder(Llama& model, const std::string& dir) {
  check_same(config_of_type(dir, HfModelType::Llama).llama, model.config(), path_in(dir, kConfigFile));
  load_llama_state(model, read_hf_weights(dir), dir);
}

void load_llama_weights(Llama& model, const std::string& safetensors_path) {
  load_llama_state(model, load_safetensors(safetensors_path).tensors, safetensors_path);
}

void load_hf_folder(GPT& model, const std::string& dir) {
  check_same(config_of_type(dir, HfModelType::Gpt2).gpt, model.config(), path_in(dir, kConfigFile));
  const TensorMap w = read_hf_weights(dir);
  try {
    model.load_state_dict(dist::shard_tensor_parallel_state(gpt2_from_hf_state(w, model), model));
  } catch (const Error& e) {
    FT_FAIL(dir, ": ", e.what());
  }
}

void save_hf_folder(const Llama& model, const std::string& dir, const HfSaveOptions& options) {
  autograd::NoGradGuard ng;
  TensorMap state = model.state_dict();
  if (model.config().tie_embeddings)
    std::erase_if(state, [](const auto& e) { return e.first == "lm_head.weight"; });  // save_pretrained's way
  write_folder(dir, llama_config_json(model.config(), options), in_hf_layer_order(state), options);
}

void save_hf_folder(const GPT& model, const std::string& dir, const HfSaveOptions& options) {
  autograd::NoGradGuard ng;
  write_folder(dir, gpt2_config_json(model.config(), options), gpt2_to_hf_state(model), options);
}

}  // namespace ft::nn
