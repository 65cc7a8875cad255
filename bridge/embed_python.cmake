# find_package(Python3 COMPONENTS ${ARGN}) for a program that embeds CPython (the bridge, the
# report's fuzz target): headers, libpython and, at run time, the standard library must all be
# those of one interpreter, Python3_EXECUTABLE.
#
# FindPython caches the headers and library it found for the first interpreter of a build
# directory and keeps them when a later configure names another one with -DPython3_EXECUTABLE
# (same minor version): `ci/gpu-job` configures with the first python3 on PATH (pyenv, conda),
# `ci/test` reconfigures with /usr/bin/python3, and the bridge then linked pyenv's libpython, which
# loaded Debian's standard library at run time ("No module named '_struct'"). So: the cached
# results are dropped whenever the requested interpreter changes, and what FindPython settles on is
# checked against the interpreter's own sysconfig; a mismatch stops the configure, saying how to
# choose.
macro(attncheck_find_embeddable_python)
  set(_aep_request "${Python3_EXECUTABLE}")
  if(DEFINED CACHE{ATTNCHECK_PYTHON_FOUND_FOR}
     AND NOT "${_aep_request}" STREQUAL "${ATTNCHECK_PYTHON_FOUND_FOR}")
    get_cmake_property(_aep_cached CACHE_VARIABLES)
    foreach(_aep_var IN LISTS _aep_cached)
      if(_aep_var MATCHES "^_Python3_")
        unset(${_aep_var} CACHE)
      endif()
    endforeach()
    message(STATUS "attncheck: Python3_EXECUTABLE changed ('${ATTNCHECK_PYTHON_FOUND_FOR}' -> "
                   "'${_aep_request}'): FindPython's cached results dropped")
  endif()
  set(ATTNCHECK_PYTHON_FOUND_FOR "${_aep_request}" CACHE INTERNAL
      "Python3_EXECUTABLE as requested when FindPython's results were cached")

  find_package(Python3 COMPONENTS ${ARGN})
  if(Python3_FOUND AND Python3_Development.Embed_FOUND)
    attncheck_check_python_is_one_install()
  endif()
endmacro()

# The include directory and libpython FindPython chose must be those the interpreter reports.
function(attncheck_check_python_is_one_install)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
            "import os, sysconfig as s
print(s.get_paths()['include'])
print(os.path.join(s.get_config_var('LIBDIR') or '', s.get_config_var('LDLIBRARY') or ''))"
    OUTPUT_VARIABLE _own OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "attncheck: ${Python3_EXECUTABLE} cannot report its sysconfig")
  endif()
  string(REPLACE "\n" ";" _own "${_own}")
  list(GET _own 0 _own_include)
  list(GET _own 1 _own_library)
  list(GET Python3_INCLUDE_DIRS 0 _found_include)
  set(_found_library "")
  foreach(_lib IN LISTS Python3_LIBRARIES)  # may hold "optimized;<lib>;debug;<lib>"
    if(EXISTS "${_lib}")
      set(_found_library "${_lib}")
      break()
    endif()
  endforeach()
  file(REAL_PATH "${_own_include}" _own_include)
  file(REAL_PATH "${_found_include}" _found_include)
  set(_problems "")
  if(NOT _own_include STREQUAL _found_include)
    string(APPEND _problems "\n  headers: ${_found_include}, the interpreter's are ${_own_include}")
  endif()
  # A static-only or relocated install reports a library that is not there: only a present one
  # can be compared.
  if(EXISTS "${_own_library}" AND _found_library)
    file(REAL_PATH "${_own_library}" _own_library)
    file(REAL_PATH "${_found_library}" _found_library)
    if(NOT _own_library STREQUAL _found_library)
      string(APPEND _problems
             "\n  libpython: ${_found_library}, the interpreter's is ${_own_library}")
    endif()
  endif()
  if(_problems)
    message(FATAL_ERROR
            "attncheck: the embedded Python would mix two installations: Python3_EXECUTABLE is "
            "${Python3_EXECUTABLE}, but${_problems}\n"
            "Configure with -DPython3_EXECUTABLE=<the python3 to embed> (Debian's: /usr/bin/python3) "
            "and, if this build directory was configured with another interpreter before, "
            "reconfigure it from scratch: cmake --fresh --preset <preset> ..., or delete its "
            "CMakeCache.txt.")
  endif()
endfunction()
