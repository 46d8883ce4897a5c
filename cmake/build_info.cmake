# Writes the build's identity (src/core/build_info.h) into OUT from cmake/build_info.cpp.in.
# Run in script mode by the rn_build_info target at every build:
#   cmake -DSOURCE_DIR=... -DOUT=... -DVERSION=... -DBUILD_TYPE=... -DCOMPILER=... -DSANITIZE=ON|OFF -P build_info.cmake
# configure_file rewrites OUT only when its text changes, so an unchanged commit recompiles
# nothing. Without git, or outside a git tree (a source tarball), the commit is "unknown".
foreach(_var SOURCE_DIR OUT VERSION)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "build_info.cmake: -D${_var}=... is required")
  endif()
endforeach()

set(RN_COMMIT "unknown")
set(RN_MODIFIED "false")
find_program(_git git)
if(_git)
  execute_process(COMMAND ${_git} -C ${SOURCE_DIR} rev-parse --short=12 HEAD
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _commit ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  # Only when SOURCE_DIR is the top of its own tree: a source tarball unpacked inside some other
  # repository must not take that repository's commit.
  execute_process(COMMAND ${_git} -C ${SOURCE_DIR} rev-parse --show-toplevel
                  RESULT_VARIABLE _rc_top OUTPUT_VARIABLE _top ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  get_filename_component(_src_real "${SOURCE_DIR}" REALPATH)
  get_filename_component(_top_real "${_top}" REALPATH)
  if(_rc EQUAL 0 AND _rc_top EQUAL 0 AND _commit MATCHES "^[0-9a-f]+$" AND _src_real STREQUAL _top_real)
    set(RN_COMMIT "${_commit}")
    # Tracked files that differ from the commit (untracked files do not count).
    execute_process(COMMAND ${_git} -C ${SOURCE_DIR} status --porcelain --untracked-files=no
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _status ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _rc EQUAL 0 OR NOT _status STREQUAL "")
      set(RN_MODIFIED "true")
    endif()
  endif()
endif()

set(RN_VERSION "${VERSION}")
set(RN_BUILD_TYPE "${BUILD_TYPE}")
set(RN_COMPILER "${COMPILER}")
if(SANITIZE)
  set(RN_SANITIZERS "true")
else()
  set(RN_SANITIZERS "false")
endif()
configure_file(${SOURCE_DIR}/cmake/build_info.cpp.in ${OUT} @ONLY)
