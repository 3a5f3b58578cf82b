// The built-in tasks by name (tasks.h): config.task picks one.
#include "fasttrain/tasks.h"

#include <cstdio>

#include "fasttrain/ops.h"

namespace ft::train {

BuiltinTask make_char_task(const TrainerConfig& c);   // char_task.cpp
BuiltinTask make_image_task(const TrainerConfig& c);  // image_task.cpp
BuiltinTask make_lm_task(const TrainerConfig& c);     // lm_task.cpp

// classify_task.cpp
BuiltinTask make_classify_task(const TrainerConfig& c);

StepOutput classification_step(nn::UnaryModule& model, const data::Batch& batch) {
  return {cross_entropy(model(batch.fields[0]), batch.fields[1]), {}};
}

StepOutput classification_eval_step(nn::UnaryModule& model, const data::Batch& batch) {
  Tensor logits = model(batch.fields[0]);
  Tensor correct = mean(eq(argmax(logits, 1), batch.fields[1]).to(DType::F32));
  return {cross_entropy(logits, batch.fields[1]), {{"accuracy", correct}}};
}

std::optional<Goal> accuracy_goal(const EvalResult& result, double goal, int64_t samples, const char* what,
                                  int64_t classes) {
  if (goal <= 0) return std::nullopt;
  const double accuracy = result.metric("accuracy").value_or(0.0);
  const bool met = accuracy >= goal;
  char buf[256];
  std::snprintf(buf, sizeof buf, "val accuracy %.2f%% on %lld %s of %lld classes (goal >= %.1f%%: %s)", 100 * accuracy,
                static_cast<long long>(samples), what, static_cast<long long>(classes), 100 * goal,
                met ? "met" : "not met");
  return Goal{buf, met};
}

BuiltinTask make_builtin_task(const TrainerConfig& c) {
  validate_task_options(c);
  if (c.task == "char") return make_char_task(c);
  if (c.task == "lm") return make_lm_task(c);
  if (c.task == "classify") return make_classify_task(c);
  FT_CHECK(c.task == "images", "task: expected char, images, lm or classify, found '", c.task, "'");
  return make_image_task(c);
}

}  // namespace ft::train
