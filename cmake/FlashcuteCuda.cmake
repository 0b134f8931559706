# Finds nvcc and enables CUDA; where there is none, or it is too old, says what to install
# rather than CMake's generic "No CMAKE_CUDA_COMPILER could be found".
#
# The toolkit floor is 12.1: the sm90 kernels use vector reductions (red.global.add.v4.f32) that
# need PTX ISA 8.1, and the Hopper path needs sm_90a (12.0). Builds and tests use CUDA 13.0.
set(FLASHCUTE_MIN_CUDA_VERSION 12.1)

function(flashcute_no_cuda_compiler why)
  message(FATAL_ERROR
    "flashcute: ${why}.\n"
    "flashcute compiles CUDA kernels and needs the NVIDIA CUDA toolkit ${FLASHCUTE_MIN_CUDA_VERSION} "
    "or newer (13.0 is the one it is built and tested with), which provides nvcc. Install it, "
    "then put its bin directory on PATH or point CUDACXX at nvcc, e.g.\n"
    "  CUDACXX=/usr/local/cuda/bin/nvcc pip install .")
endfunction()

if(NOT CMAKE_CUDA_COMPILER)
  if(NOT "$ENV{CUDACXX}" STREQUAL "")
    # CMake takes CUDACXX as given (its first word is the compiler), and nothing else.
    separate_arguments(_fc_cudacxx NATIVE_COMMAND "$ENV{CUDACXX}")
    list(GET _fc_cudacxx 0 _fc_cudacxx)
    if(NOT EXISTS "${_fc_cudacxx}")
      find_program(_fc_cudacxx_path NAMES "${_fc_cudacxx}" NO_CACHE)
      if(NOT _fc_cudacxx_path)
        flashcute_no_cuda_compiler("CUDACXX is '$ENV{CUDACXX}', which is not a program")
      endif()
    endif()
  else()
    # CMake's own search misses a toolkit that is installed but not on PATH; look there too.
    find_program(CMAKE_CUDA_COMPILER NAMES nvcc
                 PATHS ENV CUDA_PATH ENV CUDA_HOME /usr/local/cuda PATH_SUFFIXES bin)
    if(NOT CMAKE_CUDA_COMPILER)
      unset(CMAKE_CUDA_COMPILER CACHE)  # so that a later configure searches afresh
      flashcute_no_cuda_compiler("no CUDA compiler: nvcc is not on PATH, in $CUDA_PATH/bin, \
$CUDA_HOME/bin or /usr/local/cuda/bin, and CUDACXX is not set")
    endif()
  endif()
endif()

enable_language(CUDA)
if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
   AND CMAKE_CUDA_COMPILER_VERSION VERSION_LESS FLASHCUTE_MIN_CUDA_VERSION)
  flashcute_no_cuda_compiler("${CMAKE_CUDA_COMPILER} is CUDA ${CMAKE_CUDA_COMPILER_VERSION}, \
older than ${FLASHCUTE_MIN_CUDA_VERSION} (after installing a newer one, delete this build directory)")
endif()
