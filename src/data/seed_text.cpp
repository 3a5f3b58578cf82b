// The seed text of the built-in character corpus: prose written for this project. Its trigram
// counts define the Markov chain that `fasttrain train` learns (data.h, MarkovText), so the text
// only has to look like English; changing it changes the chain and its entropy floor.
#include <string_view>

namespace ft::data {

extern const std::string_view kSeedText;
const std::string_view kSeedText =
    "A small network learns to read one letter at a time. It sees a short window of text and "
    "guesses the next letter, and when the guess is wrong the error flows back through every "
    "layer and nudges each weight a little. After a few thousand steps the guesses are good, "
    "but never perfect: the text was drawn at random, so some surprise is left that no model "
    "can remove. That remainder is the entropy of the source, and the loss can only come close "
    "to it. The trainer reports how close it came. On a quiet morning the engine starts, the "
    "threads wake up, and the first batch arrives. Matrices are multiplied, softmax turns scores "
    "into odds, and the loss is written down. The optimizer keeps two running averages for every "
    "parameter, one for the gradient and one for its square, and takes a careful step. Warm up "
    "slowly, then let the learning rate fall along a cosine, and the curve bends down smoothly. "
    "Good engineers measure before they guess. They time each step, they count the tokens per "
    "second, and they keep the numbers in a table with the date and the machine. When a run is "
    "slower than it should be, they look at a profile and find the one loop that waits on memory. "
    "Then they fix it, run the tests again, and write down what changed and why. A checkpoint "
    "holds the weights, the moments of the optimizer, the step, and the state of every random "
    "stream, so a run that stops tonight can resume tomorrow and continue exactly where it was, "
    "as if nothing had happened. The same seed gives the same numbers on one thread or on many. "
    "Pictures are different: a circle, a square, a cross or a triangle, drawn in some colour on a "
    "noisy ground. A few layers of convolution find the edges, then the corners, then the whole "
    "shape, and soon the network names almost every picture right. Rain fell on the hills while "
    "the model trained. The old clock in the hall ticked, the kettle sang, and a cat slept by the "
    "window. Somebody opened a book about rivers and read that water always finds the lowest "
    "path, much like the loss that rolls down into a valley of the landscape. Is the valley deep "
    "enough? Nobody knows until the validation set answers. Keep the data you train on apart from "
    "the data you judge with, or the numbers will flatter you. Read the error message, because it "
    "says what was expected and what was found. Small tools, clear names, and honest numbers make "
    "a project that others can trust and extend. ";

}  // namespace ft::data
