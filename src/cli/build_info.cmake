# Writes build_info.h (the git commit of the source tree) at every build, rewriting it only when it
# changes, so `posttrainllm --version` names the commit the binary was built from, not the one of
# the last configure. Run by src/CMakeLists.txt: cmake -DSRC=<repo> -DOUT=<header> -P build_info.cmake
execute_process(COMMAND git describe --always --dirty --abbrev=12 WORKING_DIRECTORY "${SRC}"
                OUTPUT_VARIABLE describe OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR describe STREQUAL "")
  set(describe "unknown")
endif()
set(text "#pragma once\n#define PTLLM_GIT_DESCRIBE \"${describe}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
