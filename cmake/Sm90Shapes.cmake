# The Hopper kernels' shapes from their one table, src/cuda/sm90/shapes.def.
set(JFA_SM90_SHAPES_FILE ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/sm90/shapes.def)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${JFA_SM90_SHAPES_FILE})

# <out_forward>: "head_dim value_head_dim groups keys" per forward row, <out_backward>: "head_dim
# value_head_dim rows" per backward row, <out_head_dims>: the head_dims of the rows, each once, in
# the order of their first row.
function(jfa_sm90_shapes out_forward out_backward out_head_dims)
  file(STRINGS ${JFA_SM90_SHAPES_FILE} _rows REGEX "^JFA_SM90_(FORWARD|BACKWARD)\\(")
  set(_forward)
  set(_backward)
  set(_dims)
  foreach(_row IN LISTS _rows)
    string(REGEX MATCH "^JFA_SM90_([A-Z]+)\\(([0-9, ]+)\\)$" _whole "${_row}")
    if(NOT _whole)
      message(FATAL_ERROR "shapes.def: cannot read the row '${_row}'")
    endif()
    set(_kind "${CMAKE_MATCH_1}")  # the string() calls below reset CMAKE_MATCH_*
    string(REPLACE "," "" _numbers "${CMAKE_MATCH_2}")
    string(REGEX REPLACE " +" " " _numbers "${_numbers}")
    if(_kind STREQUAL "FORWARD")
      list(APPEND _forward "${_numbers}")
    else()
      list(APPEND _backward "${_numbers}")
    endif()
    string(REGEX MATCH "^[0-9]+" _d "${_numbers}")
    if(NOT _d IN_LIST _dims)
      list(APPEND _dims ${_d})
    endif()
  endforeach()
  set(${out_forward} "${_forward}" PARENT_SCOPE)
  set(${out_backward} "${_backward}" PARENT_SCOPE)
  set(${out_head_dims} "${_dims}" PARENT_SCOPE)
endfunction()
