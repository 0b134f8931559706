# Locates the CUTLASS/CuTe headers: CUTLASS_DIR (a checkout or an install prefix) when given,
# otherwise the headers shipped in the nvidia-cutlass Python package.
if(NOT CUTLASS_DIR)
  find_package(Python 3.9 COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source') if s else '')"
    OUTPUT_VARIABLE _fc_cutlass_source OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _fc_cutlass_source)
    message(FATAL_ERROR "CUTLASS headers not found: pip install nvidia-cutlass==4.2.0.0, or set "
                        "CUTLASS_DIR to a CUTLASS checkout")
  endif()
  set(_fc_cutlass_hint "${_fc_cutlass_source}")
else()
  set(_fc_cutlass_hint "${CUTLASS_DIR}")
endif()
find_path(FLASHCUTE_CUTLASS_INCLUDE_DIR cute/tensor.hpp
  PATHS "${_fc_cutlass_hint}" PATH_SUFFIXES include NO_DEFAULT_PATH REQUIRED)
message(STATUS "flashcute: CUTLASS headers in ${FLASHCUTE_CUTLASS_INCLUDE_DIR}")
