# `cmake --install`: the programs, the libraries with their headers, a CMake
# package (find_package(Grace) -> Grace::grace) and a pkg-config file.
# Headers keep their folders under include/grace/, so an embedding program
# writes the same `#include "actors/session.hpp"` as Grace's own sources.
include(CMakePackageConfigHelpers)

set(GRACE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Grace)
install(TARGETS grace-launch grace-train grace-ckpt grace-chaos RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET grace-train-cuda)
  install(TARGETS grace-train-cuda RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(TARGETS grace grace_messages ${GRACE_RUNTIME_LIBRARIES} grace_core EXPORT GraceTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/grace)
foreach(dir runtime actors messages)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/grace/${dir}
    FILES_MATCHING PATTERN "*.hpp" PATTERN "cuda" EXCLUDE PATTERN "chaos" EXCLUDE)
endforeach()
install(FILES ${GRACE_CAPNP_HDRS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/grace/messages)
install(EXPORT GraceTargets NAMESPACE Grace:: DESTINATION ${GRACE_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/GraceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/GraceConfig.cmake INSTALL_DESTINATION ${GRACE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/GraceConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/GraceConfig.cmake ${PROJECT_BINARY_DIR}/GraceConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake DESTINATION ${GRACE_CMAKE_DIR})

get_filename_component(GRACE_XXHASH_NAME ${XXHASH_LIBRARY} NAME)
get_filename_component(GRACE_OPENBLAS_NAME ${OPENBLAS_LIBRARY} NAME)
configure_file(${PROJECT_SOURCE_DIR}/cmake/grace.pc.in ${PROJECT_BINARY_DIR}/grace.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/grace.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
