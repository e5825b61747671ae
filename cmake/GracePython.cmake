# Optional Python extension module `grace`: -DGRACE_PYTHON=AUTO|ON|OFF.
#
# AUTO builds it when Python 3 (development headers) and pybind11 are found,
# ON makes a missing piece a configure error. The interpreter is Debian's
# /usr/bin/python3 unless Python3_EXECUTABLE says otherwise: python3-torch,
# python3-numpy and python3-pybind11 install there (a pyenv `python3` on the
# PATH sees none of them). The module links the same static libraries as the
# programs, so everything is compiled position-independent when it is built.
set(GRACE_PYTHON AUTO CACHE STRING "Build the Python module 'grace': AUTO, ON or OFF")
set_property(CACHE GRACE_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(GRACE_WITH_PYTHON OFF)

if(NOT GRACE_PYTHON STREQUAL "OFF")
  if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python interpreter for the grace module")
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
  if(Python3_FOUND)
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 2.6 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(GRACE_WITH_PYTHON ON)
    set(CMAKE_POSITION_INDEPENDENT_CODE ON)
    message(STATUS "Grace: Python module ON (${Python3_EXECUTABLE} ${Python3_VERSION}, pybind11 ${pybind11_VERSION})")
  elseif(GRACE_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "GRACE_PYTHON=ON but Python 3 development files or pybind11 were not found: "
                        "apt-get install python3-dev pybind11-dev python3-pybind11, or run scripts/setup.sh")
  else()
    message(STATUS "Grace: Python module OFF (no Python 3 development files or pybind11: "
                   "apt-get install python3-dev pybind11-dev)")
  endif()
endif()
