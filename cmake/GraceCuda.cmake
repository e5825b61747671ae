# Optional CUDA/NCCL backend: -DGRACE_CUDA=AUTO|ON|OFF.
#
# AUTO builds the backend when nvcc, cuBLAS and NCCL are all found and says
# why not otherwise; ON makes a missing piece a configure error. A machine
# without a GPU still builds it (nvcc needs no device): only running needs one.
set(GRACE_CUDA AUTO CACHE STRING "Build the CUDA/NCCL backend: AUTO, ON or OFF")
set_property(CACHE GRACE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(GRACE_WITH_CUDA OFF)

macro(grace_cuda_unavailable why)
  if(GRACE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "GRACE_CUDA=ON but ${why}; install it under /usr/local/cuda "
                        "or configure with -DGRACE_CUDA=OFF")
  else()
    message(STATUS "Grace: CUDA backend OFF (${why}; the CPU/Gloo backend is built)")
  endif()
endmacro()

if(NOT GRACE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    grace_cuda_unavailable("nvcc was not found")
  else()
    # The default static runtime put both libcudart.so (via CUDA::cudart) and
    # -lcudart_static on the link line; one shared runtime for everything.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    # Data-centre GPUs: A100 (sm_80) and H100 (sm_90). CUDA 13 rejects sm_70
    # and `native` fails at configure time on a machine without a GPU.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit)
    get_filename_component(_grace_cuda_root "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    get_filename_component(_grace_cuda_root "${_grace_cuda_root}" DIRECTORY)
    find_path(NCCL_INCLUDE_DIR nccl.h
              HINTS "${_grace_cuda_root}/include" /usr/local/cuda/include)
    find_library(NCCL_LIBRARY NAMES nccl
                 HINTS "${_grace_cuda_root}/lib64" "${_grace_cuda_root}/lib" /usr/local/cuda/lib64)
    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublas)
      grace_cuda_unavailable("the CUDA toolkit (cudart, cuBLAS) was not found")
    elseif(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY OR NOT EXISTS "${NCCL_INCLUDE_DIR}/nccl.h"
           OR NOT EXISTS "${NCCL_LIBRARY}")
      grace_cuda_unavailable("NCCL (nccl.h, libnccl) was not found")
    else()
      set(GRACE_WITH_CUDA ON)
      message(STATUS "Grace: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                     "archs ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${NCCL_LIBRARY})")
    endif()
  endif()
else()
  message(STATUS "Grace: CUDA backend OFF (GRACE_CUDA=OFF)")
endif()
