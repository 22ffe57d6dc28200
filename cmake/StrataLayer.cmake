# strata_layer_root(TARGET FOLDER): `#include "FOLDER/..."` resolves for TARGET
# and for every target that links it, and for no other. There is no global
# include directory: each library exposes its own folder through a directory
# of the build tree that holds only a link to it, so an include follows the
# links of target_link_libraries (docs/layout.md; tools/check_layers.py checks
# the direction).
function(strata_layer_root target folder)
  set(root ${CMAKE_BINARY_DIR}/layer_roots/${folder})
  if(NOT EXISTS ${root}/${folder})
    file(MAKE_DIRECTORY ${root})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${folder} ${root}/${folder} SYMBOLIC)
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    target_include_directories(${target} INTERFACE $<BUILD_INTERFACE:${root}>)
  elseif(type STREQUAL "EXECUTABLE")
    target_include_directories(${target} PRIVATE ${root})
  else()
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>)
  endif()
endfunction()
