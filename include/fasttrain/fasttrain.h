// Umbrella header.
#pragma once
#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"
#include "fasttrain/tensor.h"
