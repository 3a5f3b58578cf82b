// The task registry: the name in TrainerConfig::task picks the task.
#include "train/task.h"

namespace ft::train {

std::unique_ptr<Task> make_char_task(const TrainerConfig& c);   // char_task.cpp
std::unique_ptr<Task> make_image_task(const TrainerConfig& c);  // image_task.cpp

std::unique_ptr<Task> make_task(const TrainerConfig& c) {
  if (c.task == "char") return make_char_task(c);
  FT_CHECK(c.task == "images", "task: expected char or images, found '", c.task, "'");
  return make_image_task(c);
}

}  // namespace ft::train
