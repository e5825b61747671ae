# grace-chaos sources (plain C++: no CAF). Used by the top-level CMakeLists.txt:
#   include(runtime/chaos/sources.cmake)
#   add_executable(grace-chaos apps/grace_chaos.cpp ${GRACE_CHAOS_SOURCES})
set(GRACE_CHAOS_SOURCES
  ${PROJECT_SOURCE_DIR}/runtime/chaos/schedule.cpp
  ${PROJECT_SOURCE_DIR}/runtime/chaos/runner.cpp
  ${PROJECT_SOURCE_DIR}/runtime/chaos/job_support.cpp
  ${PROJECT_SOURCE_DIR}/runtime/chaos/host_runner.cpp
  ${PROJECT_SOURCE_DIR}/runtime/chaos/testbed.cpp
  ${PROJECT_SOURCE_DIR}/runtime/chaos/invariants.cpp
  ${PROJECT_SOURCE_DIR}/runtime/chaos/report.cpp
)
