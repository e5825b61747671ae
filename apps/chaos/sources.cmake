# grace-chaos sources (plain C++: no CAF). Used by the top-level CMakeLists.txt:
#   include(apps/chaos/sources.cmake)
#   add_executable(grace-chaos apps/chaos/grace_chaos.cpp ${GRACE_CHAOS_SOURCES})
set(GRACE_CHAOS_SOURCES
  ${PROJECT_SOURCE_DIR}/apps/chaos/schedule.cpp
  ${PROJECT_SOURCE_DIR}/apps/chaos/runner.cpp
  ${PROJECT_SOURCE_DIR}/apps/chaos/job_support.cpp
  ${PROJECT_SOURCE_DIR}/apps/chaos/host_runner.cpp
  ${PROJECT_SOURCE_DIR}/apps/chaos/testbed.cpp
  ${PROJECT_SOURCE_DIR}/apps/chaos/invariants.cpp
  ${PROJECT_SOURCE_DIR}/apps/chaos/report.cpp
)
