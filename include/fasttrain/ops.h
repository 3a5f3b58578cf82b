// Every op of the engine. One header per op family under ops/.
#pragma once
#include "fasttrain/ops/attention.h"
#include "fasttrain/ops/conv.h"
#include "fasttrain/ops/elementwise.h"
#include "fasttrain/ops/indexing.h"
#include "fasttrain/ops/linalg.h"
#include "fasttrain/ops/norm.h"
#include "fasttrain/ops/reduce.h"
#include "fasttrain/ops/rotary.h"
#include "fasttrain/ops/softmax.h"
