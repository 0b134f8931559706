# The XLA FFI headers (xla/ffi/api/ffi.h) that flashcute.jax's handlers compile against:
# FLASHCUTE_XLA_FFI_INCLUDE_DIR where set, else the include folder of the jaxlib importable by the
# Python that builds the extension (pip's isolated build environment gets jaxlib from
# pyproject.toml's build requirements). Header-only: the library links nothing of jaxlib.
set(FLASHCUTE_XLA_FFI_INCLUDE_DIR "$ENV{FLASHCUTE_XLA_FFI_INCLUDE_DIR}" CACHE PATH
  "Folder holding xla/ffi/api/ffi.h (empty: the build Python's jaxlib/include)")

# Sets `out_var` to the headers' folder, or to "" (no flashcute.jax handlers) with a message.
function(flashcute_find_xla_ffi python out_var)
  set(dir "${FLASHCUTE_XLA_FFI_INCLUDE_DIR}")
  if(NOT dir)
    execute_process(
      COMMAND "${python}" -c
        "import importlib.util, os; s = importlib.util.find_spec('jaxlib'); print(os.path.join(list(s.submodule_search_locations)[0], 'include') if s else '')"
      OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  set(header "${dir}/xla/ffi/api/c_api.h")
  if(dir AND EXISTS "${header}")
    file(STRINGS "${header}" has_ordinal REGEX "XLA_FFI_DeviceOrdinal_Get")
    if(has_ordinal)
      message(STATUS "flashcute: XLA FFI headers (flashcute.jax): ${dir}")
      set(${out_var} "${dir}" PARENT_SCOPE)
      return()
    endif()
    message(STATUS "flashcute: the XLA FFI headers in ${dir} predate the device-ordinal context; "
                   "building without flashcute.jax's handlers (use jaxlib >= 0.5)")
  else()
    message(STATUS "flashcute: no XLA FFI headers (no jaxlib in the build environment, "
                   "FLASHCUTE_XLA_FFI_INCLUDE_DIR unset); building without flashcute.jax's handlers")
  endif()
  set(${out_var} "" PARENT_SCOPE)
endfunction()
