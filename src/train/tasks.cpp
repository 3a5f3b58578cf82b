// The built-in tasks by name (tasks.h): config.task picks one.
#include "fasttrain/tasks.h"

namespace ft::train {

BuiltinTask make_char_task(const TrainerConfig& c);   // char_task.cpp
BuiltinTask make_image_task(const TrainerConfig& c);  // image_task.cpp
BuiltinTask make_lm_task(const TrainerConfig& c);     // lm_task.cpp

// classify_task.cpp
BuiltinTask make_classify_task(const TrainerConfig& c);

BuiltinTask make_builtin_task(const TrainerConfig& c) {
  if (c.task == "char") return make_char_task(c);
  if (c.task == "lm") return make_lm_task(c);
  if (c.task == "classify") return make_classify_task(c);
  FT_CHECK(c.task == "images", "task: expected char, images, lm or classify, found '", c.task, "'");
  return make_image_task(c);
}

}  // namespace ft::train
