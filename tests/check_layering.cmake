# Fails when a library depends on a layer it must not see. Run by ctest:
#   cmake -DLIBRARY=<file> -DFORBIDDEN=<regex> -P check_layering.cmake
# The fake driver, for instance, must not link torch or Python: a vendor's
# driver has to build without either.
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
