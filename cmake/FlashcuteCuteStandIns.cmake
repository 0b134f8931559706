# Empty stand-ins for the CuTe headers a kernel library never uses.
#
# cute/atom/mma_atom.hpp and copy_atom.hpp include the MMA and copy traits of every arch (SM90
# double precision and sparse WGMMA, SM100, SM120, ...), which every translation unit then
# parses: 4-6 s of front end per unit and arch on CI's machine. A library's include path
# starts with a folder of empty files of those names. A unit that needs one of them fails to
# compile rather than miscompile; the default build's kernels compile to the same SASS with and
# without them (benchmarks/BUILD.md); tile overrides that enable CuTe's extended WGMMA shapes
# compile with them too.
function(flashcute_cute_stand_ins target)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/cute_stand_ins/${target})
  foreach(header IN LISTS ARGN)
    file(CONFIGURE OUTPUT ${dir}/cute/${header}
         CONTENT "// Empty stand-in for CuTe's ${header} (cmake/FlashcuteCuteStandIns.cmake)\n")
  endforeach()
  target_include_directories(${target} BEFORE PRIVATE ${dir})
endfunction()

# Neither path: SM90 double-precision MMA (whose header brings every WGMMA), SM100 and SM120
# MMA and copies.
set(_fc_cute_other_archs
  atom/mma_traits_sm90.hpp atom/mma_traits_sm100.hpp atom/mma_traits_sm120.hpp
  atom/mma_traits_sm120_sparse.hpp atom/copy_traits_sm100.hpp atom/copy_traits_sm100_tma.hpp)
# The Ampere path (mma.sync, cp.async, ldmatrix) also takes no WGMMA and no TMA.
set(FLASHCUTE_CUTE_STAND_INS_AMPERE ${_fc_cute_other_archs}
  atom/mma_traits_sm90_gmma.hpp atom/copy_traits_sm90_tma.hpp)
# The Hopper path takes dense WGMMA and TMA, no sparse WGMMA traits (GMMA::ss_op_selector's
# header still declares the sparse instructions).
set(FLASHCUTE_CUTE_STAND_INS_HOPPER ${_fc_cute_other_archs} atom/mma_traits_sm90_gmma_sparse.hpp)
