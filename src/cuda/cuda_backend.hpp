// The CUDA backend as the API layer sees it. Built from src/cuda/ when nvcc is found; otherwise
// src/api/no_cuda.cpp answers every call with FA_ERROR_NO_DEVICE.
#pragma once

#include <cstddef>

#include "common/status.hpp"

namespace flashattn::cuda {

bool available();                      // built with CUDA and a GPU is present
bool is_device_pointer(const void* p); // memory the GPU can read (device or managed)
fa_impl best_impl(const fa_params& p, bool backward);  // the fastest kernel for this problem and GPU

Status forward(const fa_params& p, fa_impl impl);
Status backward(const fa_params& p, fa_impl impl);
Status workspace_size(const fa_params& p, fa_impl impl, bool backward, size_t* bytes);

}  // namespace flashattn::cuda
