# CUDA architectures of the two kernel paths. The Ampere path (cp.async + mma.sync) runs as sm80
# code on sm80/86/89 and as sm90 code on H100/H200; the Hopper path (TMA + WGMMA) is sm90a only.
# FLASHCUTE_AMPERE_ARCHS / FLASHCUTE_HOPPER_ARCHS set them directly; each one left empty is
# derived from CMake's own request, CMAKE_CUDA_ARCHITECTURES or else the CUDAARCHS environment
# variable (flashcute_map_archs below), or takes the default without one.
set(FLASHCUTE_DEFAULT_AMPERE_ARCHS "80;90-real")
set(FLASHCUTE_DEFAULT_HOPPER_ARCHS "90a-real")

# Before CUDA is enabled: keeps CMake's request in FLASHCUTE_ARCH_REQUEST (named by
# FLASHCUTE_ARCH_REQUEST_FROM) and shadows it with 80: CMake's compiler check builds sm80 code
# whatever was asked, and each kernel target takes its archs from flashcute_resolve_archs().
macro(flashcute_take_arch_request)
  # Build trees configured before this module hold flashcute's own "80" there: not a request.
  get_property(_fc_help CACHE CMAKE_CUDA_ARCHITECTURES PROPERTY HELPSTRING)
  if("$CACHE{CMAKE_CUDA_ARCHITECTURES}" STREQUAL "80"
     AND _fc_help STREQUAL "Architectures for host-side CUDA sources")
    unset(CMAKE_CUDA_ARCHITECTURES CACHE)
  endif()
  set(FLASHCUTE_ARCH_REQUEST "")
  set(FLASHCUTE_ARCH_REQUEST_FROM "")
  if(NOT "$CACHE{CMAKE_CUDA_ARCHITECTURES}" MATCHES "^(OFF|FALSE|NO|0)?$")
    set(FLASHCUTE_ARCH_REQUEST "$CACHE{CMAKE_CUDA_ARCHITECTURES}")
    set(FLASHCUTE_ARCH_REQUEST_FROM CMAKE_CUDA_ARCHITECTURES)
  elseif(NOT "$ENV{CUDAARCHS}" STREQUAL "")
    set(FLASHCUTE_ARCH_REQUEST "$ENV{CUDAARCHS}")
    set(FLASHCUTE_ARCH_REQUEST_FROM CUDAARCHS)
  endif()
  set(CMAKE_CUDA_ARCHITECTURES 80)
endmacro()

# Maps a CMake architecture list (request, named `from` in messages) onto the two paths:
#   80-89    Ampere-path code for that arch (as asked: -real, -virtual or both)
#   90, 90a  Ampere-path sm90 code, and the Hopper path (90a-real) unless only PTX is asked
#   < 80     left out, with a warning
#   > 90     no kernels of their own: the Ampere path ships compute_90 PTX (if nothing else
#            asked for PTX), which the driver compiles for them on first use; a warning says so
#   native   the GPUs CMake found on this machine (`native_archs`); all, all-major: the default
function(flashcute_map_archs request from native_archs out_ampere out_hopper)
  if(request MATCHES "^(all|all-major)$")
    set(${out_ampere} "${FLASHCUTE_DEFAULT_AMPERE_ARCHS}" PARENT_SCOPE)
    set(${out_hopper} "${FLASHCUTE_DEFAULT_HOPPER_ARCHS}" PARENT_SCOPE)
    return()
  endif()
  if(request STREQUAL "native")
    if(NOT native_archs)
      message(FATAL_ERROR "flashcute: ${from}=native, but CMake found no GPU here; name the "
                          "arch instead (90 for H100/H200, 80 for A100 and other sm8x GPUs)")
    endif()
    set(request "${native_archs}")
  endif()
  set(ampere "")
  set(hopper "")
  set(older "")
  set(newer "")
  set(has_ptx FALSE)
  foreach(arch IN LISTS request)
    if(NOT arch MATCHES "^([0-9]+)[af]?(-real|-virtual)?$")
      message(FATAL_ERROR "flashcute: ${from}: '${arch}' is not a CUDA architecture "
                          "(e.g. 80, 89-real, 90a, native)")
    endif()
    set(number "${CMAKE_MATCH_1}")
    set(kind "${CMAKE_MATCH_2}")
    if(number LESS 80)
      list(APPEND older "${arch}")
    elseif(number LESS_EQUAL 90)
      list(APPEND ampere "${number}${kind}")
      if(NOT kind STREQUAL "-real")
        set(has_ptx TRUE)
      endif()
      if(number EQUAL 90 AND NOT kind STREQUAL "-virtual")
        set(hopper "90a-real")
      endif()
    else()
      list(APPEND newer "${arch}")
    endif()
  endforeach()
  if(NOT older STREQUAL "")
    message(WARNING "flashcute: ${from} lists ${older}: flashcute needs sm80 or newer; left out")
  endif()
  if(NOT newer STREQUAL "")
    if(NOT has_ptx)
      list(APPEND ampere 90-virtual)
    endif()
    message(WARNING "flashcute: ${from} lists ${newer}: flashcute has no kernels for them; they run "
                    "the Ampere path from PTX, compiled by the driver on first use (untested)")
  endif()
  if(ampere STREQUAL "")
    message(FATAL_ERROR "flashcute: ${from}=${request} names no arch flashcute can run on (sm80 "
                        "or newer)")
  endif()
  list(REMOVE_DUPLICATES ampere)
  set(${out_ampere} "${ampere}" PARENT_SCOPE)
  set(${out_hopper} "${hopper}" PARENT_SCOPE)
endfunction()

# After enable_language(CUDA): fills the empty FLASHCUTE_*_ARCHS (as plain variables over the
# cache) and drops the Hopper path when it has no arch.
macro(flashcute_resolve_archs)
  if(NOT FLASHCUTE_ARCH_REQUEST STREQUAL "")
    flashcute_map_archs("${FLASHCUTE_ARCH_REQUEST}" ${FLASHCUTE_ARCH_REQUEST_FROM}
                        "${CMAKE_CUDA_ARCHITECTURES_NATIVE}" _fc_ampere _fc_hopper)
    set(_fc_from "${FLASHCUTE_ARCH_REQUEST_FROM}=${FLASHCUTE_ARCH_REQUEST}")
    if(FLASHCUTE_ARCH_REQUEST_FROM STREQUAL "CUDAARCHS")
      # CMake's first configure copies CUDAARCHS into the cache, where it would outlive the
      # variable; drop it so that the environment decides each time, as for FLASHCUTE_* options.
      unset(CMAKE_CUDA_ARCHITECTURES CACHE)
    endif()
  else()
    set(_fc_ampere "${FLASHCUTE_DEFAULT_AMPERE_ARCHS}")
    set(_fc_hopper "${FLASHCUTE_DEFAULT_HOPPER_ARCHS}")
    set(_fc_from "no request")
  endif()
  if("${FLASHCUTE_AMPERE_ARCHS}" STREQUAL "")
    set(FLASHCUTE_AMPERE_ARCHS "${_fc_ampere}")
  endif()
  if("${FLASHCUTE_HOPPER_ARCHS}" STREQUAL "")
    set(FLASHCUTE_HOPPER_ARCHS "${_fc_hopper}")
  endif()
  if("${FLASHCUTE_HOPPER_ARCHS}" STREQUAL "")
    set(FLASHCUTE_HOPPER_HEAD_DIMS "")
  endif()
  message(STATUS "flashcute: Ampere-path archs '${FLASHCUTE_AMPERE_ARCHS}', Hopper-path archs "
                 "'${FLASHCUTE_HOPPER_ARCHS}' (${_fc_from})")
endmacro()

# The Ampere-path head dims compiled without sm90 code (FLASHCUTE_AMPERE_SM90_HEAD_DIMS lists
# the others), into `out`. Their kernels get empty sm90 bodies, and the dispatch policy runs such
# head dims on an sm90 GPU on the next larger kernel. Only where the Ampere path builds sm90
# code as cubins alone: compute_90 PTX, which newer GPUs compile, keeps every head dim.
function(flashcute_ampere_sm80_only out)
  set(real90 FALSE)
  set(ptx90 FALSE)
  foreach(arch IN LISTS FLASHCUTE_AMPERE_ARCHS)
    if(arch MATCHES "^90a?(-real|-virtual)?$")
      if(NOT CMAKE_MATCH_1 STREQUAL "-virtual")
        set(real90 TRUE)
      endif()
      if(NOT CMAKE_MATCH_1 STREQUAL "-real")
        set(ptx90 TRUE)
      endif()
    endif()
  endforeach()
  set(only "")
  if(real90 AND NOT ptx90 AND NOT FLASHCUTE_AMPERE_SM90_HEAD_DIMS STREQUAL "all")
    foreach(headdim IN LISTS FLASHCUTE_AMPERE_SM90_HEAD_DIMS)
      if(NOT headdim MATCHES "^[0-9]+$")
        message(FATAL_ERROR "FLASHCUTE_AMPERE_SM90_HEAD_DIMS: '${headdim}' is not a head dim (or 'all')")
      endif()
    endforeach()
    foreach(headdim IN LISTS FLASHCUTE_AMPERE_HEAD_DIMS)
      if(NOT headdim IN_LIST FLASHCUTE_AMPERE_SM90_HEAD_DIMS)
        list(APPEND only ${headdim})
      endif()
    endforeach()
  endif()
  set(${out} "${only}" PARENT_SCOPE)
endfunction()
