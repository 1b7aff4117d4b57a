# Fails when a library depends on a layer it must not see. Run by ctest:
#   cmake -DLIBRARY=<file> -DFORBIDDEN=<regex> -P check_layering.cmake
# The fake driver, for instance, must not link torch or Python: a vendor's
# driver has to build without either.
#
# A shared library is checked by what it needs at run time (its NEEDED
# entries). A static library has none, so it is checked by the symbols it
# leaves for its user to define (nm -u, demangled): the settings parser,
# linked into the driver, must call nothing of torch, Python or the HAL.
#
# With -DINCLUDES=<dir|dir...> -DFORBIDDEN_DIRS=<dir|dir...> -DLAYER=<name>
# it checks a layer's include directories instead: none may be, or lie
# under, a folder of a layer it may not use.
if(DEFINED INCLUDES)
  string(REPLACE "|" ";" includes "${INCLUDES}")
  string(REPLACE "|" ";" forbidden_dirs "${FORBIDDEN_DIRS}")
  foreach(dir ${includes})
    foreach(forbidden ${forbidden_dirs})
      if(dir STREQUAL forbidden OR dir MATCHES "^${forbidden}/")
        message(FATAL_ERROR "${LAYER} sees the headers of a layer it may "
          "not use: its include directories hold ${dir}")
      endif()
    endforeach()
  endforeach()
  message(STATUS "${LAYER}: no include directory under ${FORBIDDEN_DIRS}")
  return()
endif()
if(LIBRARY MATCHES "\\.a$")
  execute_process(COMMAND nm -C -u "${LIBRARY}" OUTPUT_VARIABLE undefined
                  RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "nm failed on ${LIBRARY}")
  endif()
  string(REGEX MATCHALL " U [^\n]*" uses "${undefined}")
  foreach(line ${uses})
    if(line MATCHES "${FORBIDDEN}")
      message(FATAL_ERROR "${LIBRARY} calls a forbidden layer: ${line}")
    endif()
  endforeach()
  message(STATUS "${LIBRARY}: no undefined symbol matches ${FORBIDDEN}")
  return()
endif()
execute_process(COMMAND readelf -d "${LIBRARY}" OUTPUT_VARIABLE dynamic
                RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "readelf failed on ${LIBRARY}")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${dynamic}")
foreach(line ${needed})
  if(line MATCHES "${FORBIDDEN}")
    message(FATAL_ERROR "${LIBRARY} depends on a forbidden layer: ${line}")
  endif()
endforeach()
message(STATUS "${LIBRARY}: no dependency matches ${FORBIDDEN}")
