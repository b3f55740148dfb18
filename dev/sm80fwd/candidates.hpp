// Candidate forward configs timed beside the table's (dev/sm80fwd/run.sh compiles candidate.cu once
// per entry of CANDIDATES with -DCAND_INDEX=i -DCAND_CONFIG=...).
#pragma once

#include <vector>

#include "cuda/sm80/fwd_config.cuh"
#include "flashattn/flashattn.hpp"

struct Candidate {
  const char* name;
  int head_dim;
  flashattn::Status (*launch)(const flashattn::sm80::FwdParams&, cudaStream_t);
};

// Defined in candidate_list.cpp, which run.sh writes from the CANDIDATES list.
const std::vector<Candidate>& candidates();
