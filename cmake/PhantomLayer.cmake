# One function defines a layer: its library, its sources, its include
# directory (the layer's folder: headers are <folder>/phantom/...), the
# phantom layers it may use, warnings on, and, for a shared library,
# --no-undefined (so a use of a layer it does not link fails to link) and
# its installation next to the others. tests/CMakeLists.txt reads back what
# each layer declared and checks the built library against it, in both
# directions: a layer may need, and see the headers of, only the layers it
# names (and what those name), never one above it nor one it skips.
#
#   phantom_layer(<target> SHARED|STATIC
#     SOURCES <files>...
#     [LAYERS <phantom layers, linked PUBLIC>...]
#     [PRIVATE_LAYERS <phantom layers, linked PRIVATE>...]
#     [LIBRARIES <other libraries, PUBLIC>...]
#     [PRIVATE_LIBRARIES <other libraries, PRIVATE>...]
#     [INCLUDE_DIRS <more header folders>...])
#
# phantom_declare_layer(<target> FOLDER <dir> [LAYERS ...]) records a
# library that is defined elsewhere (the drivers, the Python modules) so
# the check covers it too.

function(phantom_declare_layer target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "FOLDER" "LAYERS")
  set_property(GLOBAL APPEND PROPERTY PHANTOM_LAYERS ${target})
  set_property(GLOBAL PROPERTY PHANTOM_LAYER_FOLDER_${target} "${arg_FOLDER}")
  set_property(GLOBAL PROPERTY PHANTOM_LAYER_USES_${target} "${arg_LAYERS}")
endfunction()

function(phantom_layer target kind)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" ""
    "SOURCES;LAYERS;PRIVATE_LAYERS;LIBRARIES;PRIVATE_LIBRARIES;INCLUDE_DIRS")
  add_library(${target} ${kind} ${arg_SOURCES})
  foreach(dir ${CMAKE_CURRENT_SOURCE_DIR} ${arg_INCLUDE_DIRS})
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${dir}>)
  endforeach()
  target_include_directories(${target} PUBLIC $<INSTALL_INTERFACE:include>)
  target_link_libraries(${target}
    PUBLIC ${arg_LAYERS} ${arg_LIBRARIES}
    PRIVATE ${arg_PRIVATE_LAYERS} ${arg_PRIVATE_LIBRARIES})
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(kind STREQUAL "SHARED")
    target_link_options(${target} PRIVATE ${PHANTOM_NO_UNDEFINED})
    install(TARGETS ${target} EXPORT PhantomTargets
      LIBRARY DESTINATION ${PHANTOM_INSTALL_LIBDIR})
    if(NOT SKBUILD)
      foreach(dir ${CMAKE_CURRENT_SOURCE_DIR} ${arg_INCLUDE_DIRS})
        install(DIRECTORY ${dir}/phantom DESTINATION include
          FILES_MATCHING PATTERN "*.h")
      endforeach()
    endif()
  endif()
  phantom_declare_layer(${target} FOLDER ${CMAKE_CURRENT_SOURCE_DIR}
    LAYERS ${arg_LAYERS} ${arg_PRIVATE_LAYERS})
endfunction()
