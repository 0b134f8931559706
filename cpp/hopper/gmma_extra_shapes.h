// WGMMA with both operands in shared memory at N extents 40 and 80 (16-bit inputs, fp32
// accumulators): hd 256's forward key blocks and backward tiles. CuTe declares these shapes
// only behind CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, whose 76k lines of headers cost every
// Hopper unit more front-end time than its kernels (benchmarks/BUILD.md).
#pragma once

#include <type_traits>

#include <cute/arch/mma_sm90.hpp>  // GMMA::ss_op_selector
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>

namespace flashcute::hopper::gmma {

namespace GMMA = cute::SM90::GMMA;

// One wgmma.mma_async of shape 64 × kN × 16; A and B are shared-memory descriptors.
template <class Element, int kN, GMMA::Major kMajorA, GMMA::Major kMajorB>
struct GmmaSmemOp;

// Its registers as CuTe's GMMA unpacking reads them: a descriptor each for A and B, kN / 2
// accumulators per thread, C and D aliased.
template <int kN>
struct GmmaSmemRegisters {
  using DRegisters = void;
  using ARegisters = uint64_t[1];
  using BRegisters = uint64_t[1];
  using CRegisters = float[kN / 2];
};

// The accumulator registers as fma's parameters (CuTe passes them one by one), four at a time.
#define FC_GMMA_REGS4(i) float &d##i##0, float &d##i##1, float &d##i##2, float &d##i##3
#define FC_GMMA_OUTS4(i) "+f"(d##i##0), "+f"(d##i##1), "+f"(d##i##2), "+f"(d##i##3)
// The operands after the accumulators: descriptors, then scale-d, then the immediates.
#define FC_GMMA_INS                                                                                  \
  "l"(desc_a), "l"(desc_b), "r"(int32_t(scale_d)), "n"(int32_t(GMMA::ScaleIn::One)),                \
      "n"(int32_t(GMMA::ScaleIn::One)), "n"(int32_t(kMajorA)), "n"(int32_t(kMajorB))

template <class Element, GMMA::Major kMajorA, GMMA::Major kMajorB>
struct GmmaSmemOp<Element, 40, kMajorA, kMajorB> : GmmaSmemRegisters<40> {
  CUTE_DEVICE static void fma(uint64_t const& desc_a, uint64_t const& desc_b, FC_GMMA_REGS4(0), FC_GMMA_REGS4(1),
                              FC_GMMA_REGS4(2), FC_GMMA_REGS4(3), FC_GMMA_REGS4(4),
                              GMMA::ScaleOut const scale_d = GMMA::ScaleOut::One) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
#define FC_GMMA_N40(types)                                                                             \
  asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %22, 0;\n"                                                     \
      "wgmma.mma_async.sync.aligned.m64n40k16.f32." types                                              \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19},"   \
      " %20, %21, p, %23, %24, %25, %26;\n}\n"                                                         \
      : FC_GMMA_OUTS4(0), FC_GMMA_OUTS4(1), FC_GMMA_OUTS4(2), FC_GMMA_OUTS4(3), FC_GMMA_OUTS4(4)       \
      : FC_GMMA_INS)
    if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) FC_GMMA_N40("bf16.bf16");
    else FC_GMMA_N40("f16.f16");
#undef FC_GMMA_N40
#endif
  }
};

template <class Element, GMMA::Major kMajorA, GMMA::Major kMajorB>
struct GmmaSmemOp<Element, 80, kMajorA, kMajorB> : GmmaSmemRegisters<80> {
  CUTE_DEVICE static void fma(uint64_t const& desc_a, uint64_t const& desc_b, FC_GMMA_REGS4(0), FC_GMMA_REGS4(1),
                              FC_GMMA_REGS4(2), FC_GMMA_REGS4(3), FC_GMMA_REGS4(4), FC_GMMA_REGS4(5),
                              FC_GMMA_REGS4(6), FC_GMMA_REGS4(7), FC_GMMA_REGS4(8), FC_GMMA_REGS4(9),
                              GMMA::ScaleOut const scale_d = GMMA::ScaleOut::One) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
#define FC_GMMA_N80(types)                                                                             \
  asm volatile(                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"                                                     \
      "wgmma.mma_async.sync.aligned.m64n80k16.f32." types                                              \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19,"    \
      " %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38," \
      " %39}, %40, %41, p, %43, %44, %45, %46;\n}\n"                                                   \
      : FC_GMMA_OUTS4(0), FC_GMMA_OUTS4(1), FC_GMMA_OUTS4(2), FC_GMMA_OUTS4(3), FC_GMMA_OUTS4(4),      \
        FC_GMMA_OUTS4(5), FC_GMMA_OUTS4(6), FC_GMMA_OUTS4(7), FC_GMMA_OUTS4(8), FC_GMMA_OUTS4(9)        \
      : FC_GMMA_INS)
    if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) FC_GMMA_N80("bf16.bf16");
    else FC_GMMA_N80("f16.f16");
#undef FC_GMMA_N80
#endif
  }
};

#undef FC_GMMA_REGS4
#undef FC_GMMA_OUTS4
#undef FC_GMMA_INS

// CuTe's GMMA unpacking (registers one by one, scale-d last), found by argument-dependent lookup
// on MMA_Traits<GmmaSmemOp<...>> as it is for CuTe's own GMMA ops.
using GMMA::mma_unpack;

}  // namespace flashcute::hopper::gmma

namespace flashcute::hopper {

// GMMA::ss_op_selector (fp32 accumulators), with gmma::GmmaSmemOp where the tile's N is 40 or 80
// and both operands have one 16-bit type.
template <class ElementA, class ElementB, class TileShape, cute::SM90::GMMA::Major kMajorA = cute::SM90::GMMA::Major::K,
          cute::SM90::GMMA::Major kMajorB = cute::SM90::GMMA::Major::K>
constexpr auto ss_gmma_op() {
  constexpr int kN = cute::size<1>(TileShape{});
  if constexpr (std::is_same_v<ElementA, ElementB> && sizeof(ElementA) == 2 && (kN == 40 || kN == 80))
    return gmma::GmmaSmemOp<ElementA, kN, kMajorA, kMajorB>{};
  else
    return cute::SM90::GMMA::ss_op_selector<ElementA, ElementB, float, TileShape, kMajorA, kMajorB>();
}

// The N extent of a TiledMma's WGMMA instruction: the traits assert that one spans their tile.
template <class TiledMma>
constexpr int gmma_n_extent = cute::size<1>(typename TiledMma::Atom::Shape_MNK{});

}  // namespace flashcute::hopper

namespace cute {

template <class Element, int kN, SM90::GMMA::Major kMajorA, SM90::GMMA::Major kMajorB>
struct MMA_Traits<flashcute::hopper::gmma::GmmaSmemOp<Element, kN, kMajorA, kMajorB>> {
  using ValTypeD = float;
  using ValTypeA = Element;
  using ValTypeB = Element;
  using ValTypeC = float;
  using FrgTypeA = SM90::GMMA::smem_desc<kMajorA>;
  using FrgTypeB = SM90::GMMA::smem_desc<kMajorB>;
  using Shape_MNK = Shape<_64, Int<kN>, _16>;
  using ThrID = Layout<_128>;
  using ALayout = SM90::GMMA::ABLayout<64, 16>;
  using BLayout = SM90::GMMA::ABLayout<kN, 16>;
  using CLayout = SM90::GMMA::CLayout_64xN<kN>;
  SM90::GMMA::ScaleOut accumulate_ = SM90::GMMA::ScaleOut::One;
};

}  // namespace cute
