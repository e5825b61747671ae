# Finds every required Debian package and stops with the package name to
# install when one is missing.
macro(grace_require pkg debian)
  if(NOT ${pkg}_FOUND)
    message(FATAL_ERROR "Grace needs ${pkg}: install the Debian package ${debian} "
                        "(apt-get install ${debian}), or run scripts/setup.sh")
  endif()
endmacro()

find_package(Threads REQUIRED)
find_package(CAF 0.17)
grace_require(CAF libcaf-dev)
find_package(CapnProto CONFIG QUIET)
grace_require(CapnProto "capnproto libcapnp-dev")
find_package(spdlog CONFIG QUIET)
grace_require(spdlog libspdlog-dev)
find_package(Catch2 2 CONFIG QUIET)
grace_require(Catch2 catch2)
find_package(Gloo CONFIG QUIET)
grace_require(Gloo libgloo-dev)
find_package(nlohmann_json CONFIG QUIET)
grace_require(nlohmann_json nlohmann-json3-dev)
find_package(CLI11 CONFIG QUIET)
grace_require(CLI11 libcli11-dev)

find_path(XXHASH_INCLUDE_DIR xxhash.h)
find_library(XXHASH_LIBRARY NAMES xxhash)
if(XXHASH_INCLUDE_DIR AND XXHASH_LIBRARY)
  set(xxHash_FOUND TRUE)
endif()
grace_require(xxHash libxxhash-dev)

# OpenBLAS, not the reference BLAS: ~10x faster for the MLP step.
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas)
find_library(OPENBLAS_LIBRARY NAMES openblas)
if(OPENBLAS_INCLUDE_DIR AND OPENBLAS_LIBRARY)
  set(OpenBLAS_FOUND TRUE)
endif()
grace_require(OpenBLAS libopenblas-dev)
