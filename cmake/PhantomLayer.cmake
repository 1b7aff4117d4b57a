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
#   phantom_driver(<target>
#     SOURCES <files or $<TARGET_OBJECTS:...>>...
#     [PRIVATE_LIBRARIES <other libraries>...])
#
# defines a driver: a shared library implementing device/hal/phantom/hal.h
# that knows nothing of torch. It may use only the HAL header and the
# settings parser (phantom_settings, linked in statically); it exports only
# the ph_* entry points (hidden visibility and device/hal/driver_exports.map)
# and binds its own calls to its own functions (-Bsymbolic: the runtime
# defines the ph_* names too, hal.h "The driver table"); it links with
# --no-undefined, is installed with the other libraries, and is checked
# like a layer. The fake (device/fake) and the remote driver
# (device/remote) are defined with it, and so is a vendor's
# (docs/porting.md).
#
# phantom_declare_layer(<target> FOLDER <dir> [LAYERS ...]) records a
# library that is defined elsewhere (the Python modules) so the check
# covers it too.

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

function(phantom_driver target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;PRIVATE_LIBRARIES")
  set(exports ${PROJECT_SOURCE_DIR}/device/hal/driver_exports.map)
  add_library(${target} SHARED ${arg_SOURCES})
  target_link_libraries(${target} PUBLIC phantom_hal
    PRIVATE phantom_settings ${arg_PRIVATE_LIBRARIES})
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  set_target_properties(${target} PROPERTIES
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_options(${target} PRIVATE ${PHANTOM_NO_UNDEFINED}
    "-Wl,-Bsymbolic" "-Wl,--version-script=${exports}")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${exports})
  # In the PhantomTargets export set, as every driver is: phantom_driver
  # (the top-level CMakeLists.txt) links the one PHANTOM_DRIVER names, and
  # an exported target can only link exported ones.
  install(TARGETS ${target} EXPORT PhantomTargets
    LIBRARY DESTINATION ${PHANTOM_INSTALL_LIBDIR})
  phantom_declare_layer(${target} FOLDER ${CMAKE_CURRENT_SOURCE_DIR}
    LAYERS phantom_hal phantom_settings)
endfunction()
