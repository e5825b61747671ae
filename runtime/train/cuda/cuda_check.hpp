#pragma once
/// Internal to the CUDA backend (includes CUDA headers; never include it
/// from a plain C++ header): turning CUDA/cuBLAS/NCCL result codes into
/// messages.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace grace {
namespace cuda_detail {

inline std::string describe(cudaError_t rc) {
  return std::string(cudaGetErrorName(rc)) + " (" + cudaGetErrorString(rc) + ")";
}

inline std::string describe(cublasStatus_t rc) {
  return std::string(cublasGetStatusName(rc)) + " (" + cublasGetStatusString(rc) + ")";
}

/// "<call> failed at <file>:<line>: <name> (<text>)"
template <class Rc>
std::string failure(const char* call, const char* file, int line, Rc rc) {
  return std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + describe(rc);
}

}  // namespace cuda_detail
}  // namespace grace
