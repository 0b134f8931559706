// FP8 (e4m3fn) quantization of (batch, seqlen, heads, headdim) tensors, one scale per head or
// per block of kFp8Block rows, optionally after a random-sign Hadamard transform over the head
// dim (quantize_fp8.cu checks the arguments, picks a walk and launches).
//
// A tile is kFp8Block rows of one head, 32 values per thread of its 4·kD threads (kD: the head
// dim rounded up to 32, 64, 128 or 256). With the Hadamard transform a row is kD / 32 lanes with
// 32 columns each: vector i (16 bytes) of lane l holds columns (i·lanes + l)·per_vec.., so a
// row's lanes read neighbouring vectors (whole sectors per warp instruction), and the
// butterflies run within a thread over the column bits it holds and across the row's lanes
// (shuffles) over the others; sm_90 code of the block and held walks runs the transform on
// tensor cores instead, straight from the tile's ring slot (HadamardMma,
// quantize_fp8_hadamard.h). Without it, a warp's vector i is 512 bytes of whole rows of the
// tile (Tile::kLanes).
//
// Grids are persistent and keep loads in flight: tiles are copied (cp.async) into a ring of
// shared-memory slots ahead of their use, and a thread only ever reads back the vectors its
// warp copied, so the ring needs no CTA barrier. The walks (Fp8Walk):
//  - kBlock: tiles are independent; a slot is refilled as soon as its tile is in registers.
//  - kHeld: per-head scales, a head's tiles spread over a team of CTAs, a chunk of tiles each.
//    A CTA reduces its chunk of head s tile by tile, adds its maximum into the head's slot, and
//    meanwhile quantizes its chunk of head s - 1, still in the ring, once that head's team has
//    arrived: the arrivals have a chunk's time to come in, and x is read once.
//  - kReread: per-head scales of heads longer than the rings hold: each CTA of a team reduces
//    a chunk of several tiles, then reads them again (from L2) to quantize them, tile by tile
//    between the reductions of its chunk of the next head, so that L2 holds about one head.
// Teams wait for each other (spin barriers through the workspace), so those walks run as
// cooperative launches: every CTA is resident. CTA c keeps chunk c / teams of the rows and walks
// heads c % teams, + teams, ..., so a team's CTAs handle the same head at the same step and
// neighbouring CTAs read neighbouring heads' bytes of the same rows.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernel_params.h"  // kFp8Block: rows per tile, and per scale with block scales

namespace flashcute {

constexpr float kE4m3Max = 448.f;

enum class Fp8Walk { kBlock, kHeld, kReread };

// n / d for 0 <= n < 2^31 by a multiply-high and a shift (constants from the host; the
// rounded-up reciprocal of CUTLASS's FastDivmod): integer division costs ~20 instructions.
struct Fp8Divmod {
  uint32_t d = 1, mul = 0, shift = 0;
  Fp8Divmod() = default;
  explicit Fp8Divmod(uint32_t divisor) : d(divisor) {
    uint32_t log2 = 0;  // ceil(log2(d))
    while ((uint64_t(1) << log2) < d) ++log2;
    if (d != 1) mul = uint32_t(((uint64_t(1) << (31 + log2)) + d - 1) / d), shift = log2 - 1;
  }
#ifdef __CUDACC__
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return d == 1 ? n : __umulhi(n, mul) >> shift; }
#endif
};

struct QuantizeFp8Args {
  const void* x;
  uint8_t* out;        // contiguous (batch, seqlen, nheads, headdim)
  float* descale;      // (batch, nheads) or (batch, nheads, tiles)
  uint32_t* amax;      // per-head scales: (batch * nheads) maxima as float bits; the kernel zeroes them
  uint32_t* arrived;   // per-head scales: (batch * nheads) arrival counts; the kernel zeroes them
  int64_t x_batch_stride, x_row_stride, x_head_stride;
  int batch, seqlen, nheads, headdim;
  int tiles;        // ceil(seqlen / kFp8Block)
  int slots;        // tiles of the shared-memory ring; 0: loads straight into registers
  int64_t work;     // block scales: tiles in all
  int chunk_tiles;  // per-head scales: tiles of one CTA's chunk of a head
  int chunks;       // per-head scales: chunks per head, the CTAs of a team
  int teams;        // per-head scales: teams, heads in flight at once
  Fp8Divmod by_heads, by_tiles;
  uint64_t seed;
};

// The Hadamard sign of column j: negative when the top bit of a 64-bit mix of (seed, j) is set
// (reference_fp8.hadamard_signs).
__host__ __device__ inline bool hadamard_sign_negative(uint64_t seed, int j) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull + uint64_t(j + 1) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return (h >> 63) != 0;
}

// float -> e4m3fn byte, rounded to nearest even, saturated to +-448, NaN to 0x7F: what
// cvt.rn.satfinite.e4m3x2.f32 computes, for GPUs without it (sm80) and host-side checks.
__host__ __device__ inline uint32_t e4m3_from_float(float f) {
  uint32_t bits;
#ifdef __CUDA_ARCH__
  bits = __float_as_uint(f);
#else
  std::memcpy(&bits, &f, sizeof(bits));
#endif
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;
  if (a < 0x3c800000u) {  // below 2^-6: subnormals, steps of 2^-9 (8 encodes 2^-6 itself)
    const float magnitude = fabsf(f) * 512.f;
    return sign | static_cast<uint32_t>(rintf(magnitude));
  }
  // fp32's exponent and top 3 mantissa bits, rounded to nearest even, rebiased from 127 to 7.
  const uint32_t r = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  return sign | (r < 0x7eu ? r : 0x7eu);
}

namespace quantize_fp8_detail {

// Two floats to two e4m3fn bytes (lo in the low byte).
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return e4m3_from_float(lo) | (e4m3_from_float(hi) << 8);
#endif
}

// 16 bytes of input as floats: 8 of fp16/bf16, 4 of fp32.
template <class T>
struct Input;
template <>
struct Input<__half> {
  static constexpr int kPerVec = 8;
  static __device__ __forceinline__ void to_float(const uint4& u, float* v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      std::memcpy(&h, &w[i], sizeof(h));
      const float2 f = __half22float2(h);
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  }
};
template <>
struct Input<__nv_bfloat16> {
  static constexpr int kPerVec = 8;
  static __device__ __forceinline__ void to_float(const uint4& u, float* v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
};
template <>
struct Input<float> {
  static constexpr int kPerVec = 4;
  static __device__ __forceinline__ void to_float(const uint4& u, float* v) {
    v[0] = __uint_as_float(u.x), v[1] = __uint_as_float(u.y), v[2] = __uint_as_float(u.z), v[3] = __uint_as_float(u.w);
  }
};

__device__ __forceinline__ uint4 operator^(const uint4& a, const uint4& b) {
  return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

// x / descale for the e4m3 rounding. kPrescale: x and descale first scaled by pre_a * pre_b, a
// power of two that brings a descale far from 1 into [1, 2), where the reciprocal is a normal
// number (exact scaling wherever the quotient can round to a nonzero e4m3 value).
struct Divisor {
  float descale, inv, pre_a, pre_b;
  float below, above;  // inv·(1 ∓ 2^-20): z·below and z·above bracket z / descale (Tile::encode)
  // 16-bit x (Tile::encode): where the float descale lies against amax / 448 (-1 above it, 1
  // below, 0 on it), and the bracket factor whose product then rounds right (below, above).
  int side;
  float toward;
};

// 1 / d within an ulp for normal d and 1 / d (the hardware approximation and a Newton step; no
// slow-path call as with __frcp_rn).
__device__ __forceinline__ float reciprocal(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return fmaf(r, fmaf(-d, r, 1.f), r);
}

// z / d (d > 0) rounded to odd: where the quotient is not a float, the one of its two float
// neighbours whose last bit is odd. Rounding that to e4m3 (4 significant bits, far fewer than
// fp32's 24) gives the e4m3 rounding of z / d itself, ties included, where a correctly rounded
// fp32 quotient could land exactly on an e4m3 midpoint that z / d only comes near. q is within
// an ulp after one correction step, so the remainder q·d - z is exact (fma) and its sign tells
// on which side of q the quotient lies. Remainders are negated so that zeros keep their sign.
__device__ __forceinline__ float quotient_odd(float z, float d, float inv) {
  float q = z * inv;
  q = fmaf(fmaf(q, d, -z), -inv, q);
  const float nr = fmaf(q, d, -z);
  uint32_t b = __float_as_uint(q);
  // Inexact: the neighbour toward zero (b - 1 where |z / d| < |q|, i.e. nr has q's sign), then
  // its last bit set, which is that neighbour or the other one, whichever is odd.
  const uint32_t beyond = (b ^ __float_as_uint(nr)) >> 31;
  if (nr != 0.f) b = (b + beyond - 1u) | 1u;
  return __uint_as_float(b);
}

// kExact (no Hadamard): the quotient rounded to odd, so the e4m3 byte is that of x / descale
// for the float32 descale returned. Hadamard outputs carry fp32 rounding anyway: the product
// with the reciprocal.
template <bool kPrescale, bool kExact>
__device__ __forceinline__ float scaled(float z, const Divisor& d) {
  if constexpr (kPrescale) z = z * d.pre_a * d.pre_b;
  if constexpr (kExact) return quotient_odd(z, d.descale, d.inv);
  return z * d.inv;
}

// A tile's head and first row.
struct Item {
  int b, h, row0;
};

// Block scales: tile w, heads fastest (neighbouring CTAs read neighbouring bytes of the same
// rows). Tiles are counted in 32 bits: quantize_fp8 refuses calls of 2^31 tiles or more.
__device__ __forceinline__ Item block_item(const QuantizeFp8Args& a, uint32_t w) {
  const uint32_t t = a.by_heads.div(w), b = a.by_tiles.div(t);
  return {int(b), int(w - t * uint32_t(a.nheads)), int(t - b * uint32_t(a.tiles)) * kFp8Block};
}

// Per-head scales, in two calls by one thread: head_max adds the CTA's maximum into its head's
// slot; head_count, later, counts the CTA in. The count's address depends on what head_max's
// atomic returned (always 0 more: maxima are non-negative floats, at most inf), so the count
// leaves only once the maximum has been applied in L2, where head_wait reads both. A release
// fence would order them as well, but it also waits for the thread's ring fills in flight; the
// dependency costs nothing once the atomic is back, hence the call in between.
__device__ __forceinline__ uint32_t head_max(const QuantizeFp8Args& a, int group, float amax) {
  uint32_t old;
  asm volatile("atom.relaxed.gpu.global.max.u32 %0, [%1], %2;"
               : "=r"(old) : "l"(a.amax + group), "r"(__float_as_uint(amax)) : "memory");
  return old;
}
__device__ __forceinline__ void head_count(const QuantizeFp8Args& a, int group, uint32_t old_max) {
  uint32_t* count = a.arrived + group + (old_max > 0x7f800000u ? 1 : 0);
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
}

// Every thread: waits until the head's whole team has arrived; returns the head's maximum.
// kShared: thread 0 alone polls, with relaxed loads, then takes the count once with acquire and
// passes the maximum on through s_head[parity] (calls alternate parities) at a CTA barrier;
// used where that measured faster (benchmarks/results/h200-quantize-fp8-head-wait.txt).
template <bool kShared>
__device__ __forceinline__ float head_wait(const QuantizeFp8Args& a, int group, float (&s_head)[2], int parity) {
  if constexpr (kShared) {
    if (threadIdx.x == 0) {
      for (;;) {
        uint32_t seen;
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(a.arrived + group) : "memory");
        if (seen >= uint32_t(a.chunks)) break;
        __nanosleep(64);
      }
      uint32_t seen, bits;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(a.arrived + group) : "memory");
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(bits) : "l"(a.amax + group) : "memory");
      s_head[parity] = __uint_as_float(bits);
    }
    __syncthreads();
    return s_head[parity];
  } else {
    for (;;) {
      uint32_t seen;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(a.arrived + group) : "memory");
      if (seen >= uint32_t(a.chunks)) break;
      __nanosleep(64);
    }
    uint32_t bits;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(bits) : "l"(a.amax + group) : "memory");
    return __uint_as_float(bits);
  }
}

// A grid-wide barrier in two halves (cooperative groups'), so that work can go between them;
// a plain grid sync at wait() where the toolkit predates the split (CUDA 12.2).
struct GridBarrier {
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 2)
  unsigned int token = 0;
  __device__ void arrive() { token = cooperative_groups::this_grid().barrier_arrive(); }
  __device__ void wait() { cooperative_groups::this_grid().barrier_wait(std::move(token)); }
#else
  __device__ void arrive() {}
  __device__ void wait() { cooperative_groups::this_grid().sync(); }
#endif
};

// cp.async bookkeeping: one group per ring fill (empty ones too), so that "the fill of tile n
// has landed" is always "at most `pending` later groups outstanding".
__device__ __forceinline__ void commit_fill() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void wait_fills(int pending) {
  switch (pending) {
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
  }
}

// The Hadamard signs a thread applies (Tile::values).
struct Signs {
  const uint4* masks;  // 16-bit inputs: per vector of a row, XOR masks of the sign bits
  const uint32_t* lane_bits;  // fp32 inputs: per lane of a row, bit l set where the thread's value l is negated
};

// kMma: the tile feeds HadamardMma (quantize_fp8_hadamard.h): its slots keep rows in order
// (slot_vector), and lane() and row() are read from threadIdx where used, which held would
// spill at 64 registers a thread there.
template <class T, int kD, bool kHadamard, bool kMma = false>
struct Tile {
  static constexpr int kThreads = 4 * kD;
  static constexpr int kPerVec = Input<T>::kPerVec;
  static constexpr int kVecs = 32 / kPerVec;  // 16-byte vectors per thread
  static constexpr int kSlotVecs = kVecs * kThreads;  // 16-byte vectors of a ring slot
  static constexpr int kSlotBytes = 16 * kSlotVecs;
  // With kHadamard a thread holds 32 columns of one row (kD / 32 lanes per row: the butterflies
  // stay within the row's lanes). Without it values are independent, and vector i of thread t
  // is the tile's 16-byte chunk i·kThreads + t in row order: a warp's vector reads whole
  // 128-byte lines of x (a quarter of the L2 requests of 32-column rows at head dim 64).
  static constexpr int kLanes = kHadamard ? kD / 32 : kD / kPerVec;  // threads per row in a vector
  static constexpr int kRowStep = kHadamard ? 0 : kThreads / kLanes;  // rows from vector i to i + 1
  static_assert(kThreads / kLanes * (kHadamard ? 1 : kVecs) == kFp8Block, "a tile is kFp8Block rows");
  static_assert(kLanes % 2 == 0, "store() pairs neighbouring lanes of a row");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // sm_80 code reads them from threadIdx where used: held, they cost a spilled register at hd 256
  // under the 64-register cap.
  __device__ Tile() {}
  __device__ __forceinline__ int lane() const { return int(threadIdx.x) % kLanes; }
  __device__ __forceinline__ int row() const { return int(threadIdx.x) / kLanes; }
#else
  // Held on sm_90, where reading them where used was slower at hd 256 (benchmarks/results).
  int lane_, row_;
  __device__ Tile() : lane_(int(threadIdx.x) % kLanes), row_(int(threadIdx.x) / kLanes) {}
  __device__ __forceinline__ int lane() const { return kMma ? thread() % kLanes : lane_; }
  __device__ __forceinline__ int row() const { return kMma ? thread() / kLanes : row_; }
#endif
  static __device__ __forceinline__ int thread() {  // not hoisted out of loops, unlike threadIdx.x
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
  }

  // The first column of vector i of `lane` (the thread's value l is column(l / kPerVec) + l % kPerVec),
  // in row row() + i·kRowStep of the tile.
  static __host__ __device__ constexpr int column_of(int lane, int i) {
    return (kHadamard ? i * kLanes + lane : lane) * kPerVec;
  }
  __device__ __forceinline__ int column(int i) const { return column_of(lane(), i); }

  __device__ __forceinline__ const T* thread_ptr(const QuantizeFp8Args& a, const Item& it) const {
    return static_cast<const T*>(a.x) + it.b * a.x_batch_stride + int64_t(it.row0 + row()) * a.x_row_stride +
           it.h * a.x_head_stride + column(0);
  }
  __device__ __forceinline__ bool in_x(const QuantizeFp8Args& a, const Item& it, int i) const {
    return it.row0 + row() + i * kRowStep < a.seqlen && (kHadamard || column(i) < a.headdim);
  }

  // The thread's vector i, from src, the address of its vector 0 (thread_ptr).
  __device__ __forceinline__ const T* vector_ptr(const T* src, const QuantizeFp8Args& a, int i) const {
    if constexpr (kHadamard) {
      return src + column(i) - column(0);
    } else {
      return src + int64_t(i * kRowStep) * a.x_row_stride;
    }
  }

  // The thread's vectors of a tile, zeros outside x. kStream: read once more at most (L2
  // evict-first), for the second reading of kReread.
  template <bool kStream>
  __device__ __forceinline__ void load(uint4 (&raw)[kVecs], const QuantizeFp8Args& a, const Item& it) const {
    const T* src = thread_ptr(a, it);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const uint4* p = reinterpret_cast<const uint4*>(vector_ptr(src, a, i));
      raw[i] = make_uint4(0, 0, 0, 0);
      if (in_x(a, it, i)) raw[i] = kStream ? __ldcs(p) : __ldg(p);
    }
  }

  // Where a ring slot keeps the thread's vector i: at i * kThreads + t (conflict-free), or with
  // kMma in row order, row r's 16-byte unit c at r·kD/kPerVec + (c ^ (r % 8)): conflict-free for
  // the copies (fetch) and for HadamardMma's ldmatrix reads, whose 8 rows share a unit.
  static __device__ __forceinline__ int slot_index(int r, int c) { return r * (kD / kPerVec) + (c ^ (r & 7)); }
  __device__ __forceinline__ int slot_vector(int i) const {
    if constexpr (kMma) {
      return slot_index(row(), column(i) / kPerVec);
    } else {
      return i * kThreads + int(threadIdx.x);
    }
  }

  // The same copied asynchronously into the thread's own vectors of a ring slot, for take() to
  // collect after wait_fills().
  __device__ __forceinline__ void fetch(uint4* slot, const QuantizeFp8Args& a, const Item& it) const {
    if constexpr (kMma && kD < 256) {
      // Each warp copies the rows its HadamardMma reads (1024 / kD from row w·1024 / kD), vector i
      // of lane l their 16-byte unit 32i + l: whole rows, whole 128-byte lines, per instruction
      // (a row's lanes below read one or two sectors of each of 8-16 lines; at hd 256 whole lines,
      // and faster than this: benchmarks/results/h200-quantize-fp8-hadamard-mma.txt).
      constexpr int kUnits = kD / kPerVec;  // a row's
      const int t = thread(), l = t % 32, rows = (t / 32) * (1024 / kD);
      const T* src = static_cast<const T*>(a.x) + it.b * a.x_batch_stride + it.h * a.x_head_stride;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int r = rows + (32 * i + l) / kUnits, u = (32 * i + l) % kUnits;
        const bool inside = it.row0 + r < a.seqlen;
        const uint32_t dst = uint32_t(__cvta_generic_to_shared(&slot[slot_index(r, u)]));
        const void* from = inside ? static_cast<const void*>(src + int64_t(it.row0 + r) * a.x_row_stride + u * kPerVec)
                                  : a.x;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(from), "r"(inside ? 16 : 0)
                     : "memory");
      }
      return;
    }
    const T* src = thread_ptr(a, it);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const bool inside = in_x(a, it, i);
      const uint32_t dst = uint32_t(__cvta_generic_to_shared(&slot[slot_vector(i)]));
      const void* from = inside ? static_cast<const void*>(vector_ptr(src, a, i)) : a.x;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(from), "r"(inside ? 16 : 0)
                   : "memory");
    }
  }
  __device__ __forceinline__ void take(uint4 (&raw)[kVecs], const uint4* slot) const {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) raw[i] = slot[slot_vector(i)];
  }

  // The thread's 32 values in fp32 (v[l]: column(l / kPerVec) + l % kPerVec). With kHadamard,
  // the sign flips (16-bit inputs: XOR masks on the packed vectors; fp32: one bit per value,
  // fewer registers than 32 masks), then a butterfly per column bit, as reference_fp8.hadamard
  // (in another order, which only moves fp32 roundings): the 5 bits of l within the thread,
  // the lane bits across the row's lanes. The 1/sqrt(d) is left out: it goes into the descale.
  __device__ __forceinline__ void values(const uint4 (&raw)[kVecs], float (&v)[32], const Signs& signs) const {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      uint4 u = raw[i];
      if constexpr (kHadamard && sizeof(T) == 2) u = u ^ signs.masks[column(i) / kPerVec];
      Input<T>::to_float(u, &v[i * kPerVec]);
    }
    if constexpr (kHadamard) {
      if constexpr (sizeof(T) == 4) {
        // Read per tile (volatile): masks derived once would hold 32 registers for the kernel.
        const uint32_t bits = *static_cast<const volatile uint32_t*>(&signs.lane_bits[lane()]);
#pragma unroll
        for (int l = 0; l < 32; ++l) v[l] = __uint_as_float(__float_as_uint(v[l]) ^ ((bits << (31 - l)) & 0x80000000u));
      }
#pragma unroll
      for (int h = 1; h < 32; h *= 2)
#pragma unroll
        for (int l = 0; l < 32; ++l)
          if (!(l & h)) {
            const float x = v[l], y = v[l + h];
            v[l] = x + y, v[l + h] = x - y;
          }
#pragma unroll
      for (int m = 1; m < kLanes; m *= 2) {
        const float s = (lane() & m) ? -1.f : 1.f;  // the upper partner keeps other - own
#pragma unroll
        for (int l = 0; l < 32; ++l) v[l] = fmaf(s, v[l], __shfl_xor_sync(0xffffffffu, v[l], m));
      }
    }
  }

  // Vectors j and j + 1 of the thread as e4m3 bytes, 4 to a word, from v with kHadamard, else
  // from raw converted again. Without the transform each byte is the e4m3 rounding of
  // z / descale, which z·below and z·above bracket: where their bytes agree they are its
  // rounding. Where they differ, the quotient is within 2^-19 of an e4m3 midpoint, and for
  // 16-bit x (kBracket) 448·x / amax, a quotient of two 16-bit values, is either a midpoint
  // exactly or at least 2^-16 (relative) away from one. So it is a midpoint (amax 4.5, x 1.6875:
  // 168) that only the descale's rounding moves: z / descale lies below it where the descale
  // was rounded up (then z·below's byte is right everywhere), above it where rounded down
  // (z·above's), on it where the descale is exact (the even byte of the two). One product a
  // value, by d.toward (tests/test_quantize_fp8_bracket.py). fp32 x takes quotient_odd.
  template <bool kPrescale>
  __device__ __forceinline__ void encode(uint32_t (&w)[2][kPerVec / 4], int j, const uint4 (&raw)[kVecs],
                                         const float (&v)[32], const Divisor& d) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    constexpr bool kBracket = false;  // e4m3 conversions in software: two cost more than the exact quotient
#else
    constexpr bool kBracket = !kHadamard && !kPrescale && sizeof(T) == 2;
#endif
    auto pack = [](const float* u, float scale) {
      return e4m3x2(u[0] * scale, u[1] * scale) | (e4m3x2(u[2] * scale, u[3] * scale) << 16);
    };
    auto pack_quotients = [](const float* q) { return e4m3x2(q[0], q[1]) | (e4m3x2(q[2], q[3]) << 16); };
    auto values_of = [&](int p, float (&u)[kPerVec]) {
      if constexpr (kHadamard) {
#pragma unroll
        for (int e = 0; e < kPerVec; ++e) u[e] = v[(j + p) * kPerVec + e];
      } else {
        Input<T>::to_float(raw[j + p], u);
      }
    };
    auto exact = [&] {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        float u[kPerVec];
        values_of(p, u);
#pragma unroll
        for (int k = 0; k < kPerVec / 4; ++k) {
          float q[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) q[e] = scaled<kPrescale, !kHadamard>(u[4 * k + e], d);
          w[p][k] = pack_quotients(q);
        }
      }
    };
    if constexpr (kBracket) {
      if (d.side != 0) {  // uniform
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          float u[kPerVec];
          values_of(p, u);
#pragma unroll
          for (int k = 0; k < kPerVec / 4; ++k) w[p][k] = pack(&u[4 * k], d.toward);
        }
      } else {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          float u[kPerVec];
          values_of(p, u);
#pragma unroll
          for (int k = 0; k < kPerVec / 4; ++k) {
            const uint32_t lo = pack(&u[4 * k], d.below), hi = pack(&u[4 * k], d.above);
            const uint32_t odd = (lo & 0x01010101u) * 0xffu;  // 0xff in each byte of lo with an odd code
            w[p][k] = (lo & ~odd) | (hi & odd);
          }
        }
      }
    } else {
      exact();
    }
  }

  // Quantizes and stores the thread's values. Pairs of lanes swap half their bytes first, so
  // that each stores two vectors' bytes that are neighbours in the row (16-byte stores for
  // 16-bit inputs): lane 2p the even vectors' pairs (its own, then 2p + 1's), lane 2p + 1 the
  // odd ones (in their own rows without kHadamard).
  template <bool kPrescale>
  __device__ __forceinline__ void store(const uint4 (&raw)[kVecs], const float (&v)[32], const QuantizeFp8Args& a,
                                        const Item& it, const Divisor& d) const {
    constexpr int kWords = kPerVec / 4;  // 32-bit words of e4m3 bytes per vector
    const bool odd = lane() & 1;
#pragma unroll
    for (int j = 0; j < kVecs; j += 2) {
      uint32_t w[2][kWords];  // vectors j and j + 1
      encode<kPrescale>(w, j, raw, v, d);
      uint32_t lo[kWords], hi[kWords];
      int col = column(j);
#pragma unroll
      for (int k = 0; k < kWords; ++k) {
        const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? w[0][k] : w[1][k], 1);
        lo[k] = odd ? got : w[0][k];
        hi[k] = odd ? w[1][k] : got;
      }
      if (odd) col = column(j + 1) - kPerVec;
      const int r = it.row0 + row() + (odd ? j + 1 : j) * kRowStep;
      if (r >= a.seqlen) continue;
      uint8_t* dst = a.out + ((int64_t(it.b) * a.seqlen + r) * a.nheads + it.h) * a.headdim;
      if constexpr (kPerVec == 8) {
        if (kHadamard || ((a.headdim & 15) == 0 && col + 16 <= a.headdim)) {
          __stcs(reinterpret_cast<uint4*>(dst + col), make_uint4(lo[0], lo[1], hi[0], hi[1]));
        } else {  // rows of 8 (mod 16) bytes, or the end of a row: 8-byte stores inside the row
          if (col < a.headdim) __stcs(reinterpret_cast<uint2*>(dst + col), make_uint2(lo[0], lo[1]));
          if (col + 8 < a.headdim) __stcs(reinterpret_cast<uint2*>(dst + col + 8), make_uint2(hi[0], hi[1]));
        }
      } else if (kHadamard || col < a.headdim) {  // 8 bytes from a multiple of 8: inside the row
        __stcs(reinterpret_cast<uint2*>(dst + col), make_uint2(lo[0], hi[0]));
      }
    }
  }
};

// amax / 448 rounded to float (a double product: no division call in the kernel; 1/448 is off
// by under 2^-53, which moves no quotient across a float rounding boundary, and quotients that
// are floats come out exactly); 1 for amax 0. The Hadamard's 1/sqrt(d) only enters the descale
// returned, not the one values are divided by.
template <bool kScaled, int kD>
__device__ __forceinline__ float descale_of(float amax) {
  if (!(amax > 0.f)) return 1.f;
  constexpr double kRsqrt = kD == 64 ? 0.125 : kD == 128 ? 0.088388347648318440550 : kD == 256 ? 0.0625 : 1.0;
  return float(double(amax) * ((kScaled ? kRsqrt : 1.0) / double(kE4m3Max)));
}

// The CTA's maximum of `local` (every thread calls it; every thread gets it) with one CTA
// barrier: s_warp alternates between two halves (parity), so the next call's writes cannot
// race this call's reads.
template <int kWarps>
__device__ __forceinline__ float cta_max(float local, uint32_t (&s_warp)[2][kWarps], int parity) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const uint32_t m = __reduce_max_sync(0xffffffffu, __float_as_uint(local));  // >= 0: bits order as values
  if (lane == 0) s_warp[parity][warp] = m;
  __syncthreads();
  return __uint_as_float(__reduce_max_sync(0xffffffffu, lane < kWarps ? s_warp[parity][lane] : 0u));
}

// The thread's maximum |value| of a tile (v holds the transformed values with kHadamard).
template <class T, int kD, bool kHadamard, bool kWhere>
__device__ __forceinline__ float local_amax(const Tile<T, kD, kHadamard, kWhere>& tile,
                                            const uint4 (&raw)[Tile<T, kD, kHadamard, kWhere>::kVecs], float (&v)[32],
                                            const Signs& signs) {
  float m = 0.f;
  if constexpr (kHadamard) {
    tile.values(raw, v, signs);
#pragma unroll
    for (int l = 0; l < 32; ++l) m = fmaxf(m, fabsf(v[l]));
  } else if constexpr (sizeof(T) == 2) {
    // On packed pairs (the maximum of 16-bit values is one of them, exact): one instruction a
    // pair. NaNs are skipped, as by fmaxf.
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    T2 m2;
    std::memset(&m2, 0, sizeof(m2));
#pragma unroll
    for (int i = 0; i < Tile<T, kD, kHadamard, kWhere>::kVecs; ++i) {
      const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        T2 pair;
        std::memcpy(&pair, &w[k], sizeof(pair));
        m2 = __hmax2(m2, __habs2(pair));
      }
    }
    m = fmaxf(float(m2.x), float(m2.y));
  } else {
#pragma unroll
    for (int i = 0; i < Tile<T, kD, kHadamard, kWhere>::kVecs; ++i) {
      float f[Input<T>::kPerVec];
      Input<T>::to_float(raw[i], f);
#pragma unroll
      for (int e = 0; e < Input<T>::kPerVec; ++e) m = fmaxf(m, fabsf(f[e]));
    }
  }
  return m;
}

// The Divisor for amax, handed to store(std::bool_constant<kPrescale>, d).
template <class Store>
__device__ __forceinline__ void quantize_with(float amax, Store&& store) {
  Divisor d;
  d.descale = descale_of<false, 0>(amax);
  d.pre_a = d.pre_b = 1.f;
  if (d.descale >= 0x1p-90f && d.descale <= 0x1p90f) {
    d.inv = reciprocal(d.descale);
    // inv is within an ulp of 1 / descale and each product rounds by half an ulp: 2^-20 keeps
    // z·below and z·above on either side of z / descale.
    d.below = d.inv * (1.f - 0x1p-20f), d.above = d.inv * (1.f + 0x1p-20f);
    const float off = fmaf(d.descale, kE4m3Max, -amax);  // one rounding: its sign is exact
    d.side = off > 0.f ? -1 : off < 0.f ? 1 : 0;
    d.toward = off > 0.f ? d.below : d.above;
    store(std::false_type{}, d);
    return;
  }
  if (isinf(d.descale)) {  // amax inf: finite values go to 0, infinities to NaN, as x / inf
    d.descale = d.inv = 1.f, d.pre_a = d.pre_b = 0.f;
  } else {
    int e;
    frexpf(d.descale, &e);  // descale in [2^(e-1), 2^e)
    d.pre_a = ldexpf(1.f, (1 - e) / 2), d.pre_b = ldexpf(1.f, (1 - e) - (1 - e) / 2);
    d.descale = d.descale * d.pre_a * d.pre_b;
    d.inv = reciprocal(d.descale);
  }
  store(std::true_type{}, d);
}

template <class Tl, class Raw>
__device__ __forceinline__ void quantize_store(const Tl& tile, const Raw& raw, const float (&v)[32],
                                               const QuantizeFp8Args& a, const Item& it, float amax) {
  quantize_with(amax, [&](auto prescale, const Divisor& d) {
    tile.template store<decltype(prescale)::value>(raw, v, a, it, d);
  });
}

// Per-head walks: this CTA's place, its chunk of rows and team.
struct Team {
  int chunk, team, steps;  // steps: heads this CTA walks
  __device__ Team(const QuantizeFp8Args& a) : chunk(int(blockIdx.x) / a.teams), team(int(blockIdx.x) % a.teams) {
    const int groups = a.batch * a.nheads;
    steps = team < groups ? (groups - 1 - team) / a.teams + 1 : 0;
  }
  __device__ __forceinline__ int group(int s, const QuantizeFp8Args& a) const { return s * a.teams + team; }
  __device__ __forceinline__ Item item(int s, int t, const QuantizeFp8Args& a) const {
    const int g = group(s, a), b = int(a.by_heads.div(uint32_t(g)));
    return {b, g - b * a.nheads, (chunk * a.chunk_tiles + t) * kFp8Block};
  }
};

}  // namespace quantize_fp8_detail

}  // namespace flashcute

#include "quantize_fp8_hadamard.h"  // HadamardMma, on Tile and the helpers above

namespace flashcute {

// Register budget: 1024 threads per SM for block scales, 512 for the per-head walks (whose rings
// take most of an SM's shared memory) up to head dim 128. Dynamic shared memory: a.slots ring
// slots of Tile::kSlotBytes.
template <class T, int kD, bool kHadamard, Fp8Walk kWalk>
__global__ void __launch_bounds__(4 * kD, kWalk == Fp8Walk::kBlock || kD == 256 ? 256 / kD : 128 / kD)
    quantize_fp8_kernel(const QuantizeFp8Args a) {
  using namespace quantize_fp8_detail;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The transform on tensor cores where the tile is read from its slot (quantize_fp8_hadamard.h).
  constexpr bool kMma = kHadamard && sizeof(T) == 2 && kWalk != Fp8Walk::kReread;
#else
  constexpr bool kMma = false;
#endif
  using Tl = Tile<T, kD, kHadamard, kMma>;
  constexpr int kWarps = Tl::kThreads / 32;
  extern __shared__ uint4 s_ring[];
  __shared__ uint4 s_masks[kHadamard && sizeof(T) == 2 ? kD / Tl::kPerVec : 1];
  __shared__ uint32_t s_bits[kD / 32];
  __shared__ uint32_t s_lane_bits[kHadamard ? Tl::kLanes : 1];
  __shared__ uint32_t s_warp[2][kWarps];
  constexpr bool kSharedWait = kHadamard && kD <= 128;  // head_wait
  __shared__ float s_head[2];
  using Hm = HadamardMma<std::conditional_t<sizeof(T) == 2, T, __half>, kD <= 64 ? 64 : kD>;
  const Tl tile;
  const Signs signs{s_masks, s_lane_bits};
  const int slots = a.slots;
  auto slot = [&](int i) { return s_ring + i * Tl::kSlotVecs; };
  auto next_slot = [&](int i) { return i + 1 == slots ? 0 : i + 1; };

  // After the walk's first fills: the Hadamard sign tables and, for per-head walks, the
  // workspace zeroed, with a grid barrier (cooperative groups' own) around the tables.
  auto setup = [&] {
    [[maybe_unused]] GridBarrier barrier;
    if constexpr (kWalk != Fp8Walk::kBlock) {
      const int groups = a.batch * a.nheads;
      for (int g = int(blockIdx.x * blockDim.x + threadIdx.x); g < groups; g += int(gridDim.x * blockDim.x))
        a.amax[g] = 0, a.arrived[g] = 0;
      barrier.arrive();
    }
    if constexpr (kHadamard) {
      if (threadIdx.x < kD) {  // bit j of the table: column j negated
        const uint32_t word = __ballot_sync(0xffffffffu, hadamard_sign_negative(a.seed, threadIdx.x));
        if (threadIdx.x % 32 == 0) s_bits[threadIdx.x / 32] = word;
      }
      __syncthreads();
      if constexpr (sizeof(T) == 2) {  // one 32-bit mask per word of a row: the sign bits of its 2 columns
        uint32_t* masks = reinterpret_cast<uint32_t*>(s_masks);
        for (int w = threadIdx.x; w < kD / 2; w += Tl::kThreads) {
          const uint32_t pair = s_bits[w / 16] >> (2 * (w % 16));
          masks[w] = ((pair & 1u) << 15) | ((pair & 2u) << 30);
        }
      } else if (threadIdx.x < Tl::kLanes) {
        uint32_t bits = 0;
        for (int l = 0; l < 32; ++l) {
          const int col = Tl::column_of(threadIdx.x, l / Tl::kPerVec) + l % Tl::kPerVec;
          bits |= ((s_bits[col / 32] >> (col % 32)) & 1u) << l;
        }
        s_lane_bits[threadIdx.x] = bits;
      }
      if constexpr (kMma) Hm::fill(Hm::tables(), s_bits);
      __syncthreads();
    }
    if constexpr (kWalk != Fp8Walk::kBlock) barrier.wait();
  };

  uint4 raw[Tl::kVecs];
  float v[32];
  // kMma: the tile's values straight from its slot (filled: the warp syncs first), and their maximum.
  auto mma_amax = [&](const uint4* s) {
    __syncwarp();
    Hm::values(s, Hm::tables(), v);
    float m = 0.f;
#pragma unroll
    for (int l = 0; l < 32; ++l) m = fmaxf(m, fabsf(v[l]));
    return m;
  };
  auto mma_store = [&](uint4* s, const Item& it, float amax) {
    quantize_with(amax, [&](auto prescale, const Divisor& d) {
      Hm::template store<decltype(prescale)::value>(v, s, a, it, d);
    });
  };

  if constexpr (kWalk == Fp8Walk::kBlock) {
    // Tiles blockIdx.x, + gridDim.x, ...; `slots` of them in flight.
    const uint32_t work = uint32_t(a.work), first = blockIdx.x;
    const uint32_t count = first < work ? (work - 1 - first) / gridDim.x + 1 : 0;
    auto item = [&](uint32_t n) { return block_item(a, first + n * gridDim.x); };
    for (int n = 0; n < slots; ++n) {
      if (uint32_t(n) < count) tile.fetch(slot(n), a, item(n));
      commit_fill();
    }
    setup();
    for (uint32_t n = 0, i = 0; n < count; ++n) {  // i: tile n's slot
      const Item it = item(n);
      float m;
      if constexpr (kMma) {  // slots >= 1 (quantize_fp8.cu)
        wait_fills(slots - 1);
        m = mma_amax(slot(i));
      } else {
        if (slots == 0) {
          tile.template load<false>(raw, a, it);
        } else {
          wait_fills(slots - 1);
          tile.take(raw, slot(i));
        }
        m = local_amax(tile, raw, v, signs);
      }
      // The slot takes the tile `slots` further once raw is in registers (m used it); with the
      // Hadamard transform only after the stores, when v no longer holds registers.
      auto refill = [&] {
        if (slots > 0) {
          if (n + slots < count) tile.fetch(slot(i), a, item(n + slots));
          commit_fill();
          i = next_slot(i);
        }
      };
      if constexpr (!kHadamard) refill();
      const float amax = cta_max<kWarps>(m, s_warp, n & 1);
      if (threadIdx.x == 0)
        a.descale[(int64_t(it.b) * a.nheads + it.h) * a.tiles + it.row0 / kFp8Block] = descale_of<kHadamard, kD>(amax);
      if constexpr (kMma) {
        mma_store(slot(i), it, amax);
      } else {
        quantize_store(tile, raw, v, a, it, amax);
      }
      if constexpr (kHadamard) refill();
    }
  } else if constexpr (kWalk == Fp8Walk::kHeld) {
    // The CTA's tiles in order, k = s * len + t (tile t of its chunk of head step s), tile k in
    // slot k % slots. Tile k is reduced at iteration k and quantized, still in its slot, at
    // iteration k + len (its head's team has had a chunk's time to arrive); its slot then takes
    // tile k + slots. So a chunk waits in the ring and slots - len tiles are in flight.
    const Team team(a);
    const int len = min(a.chunk_tiles, a.tiles - team.chunk * a.chunk_tiles);
    const int total = team.steps * len;
    int filled = 0;
    auto fill = [&] {
      if (filled < total) tile.fetch(slot(filled % slots), a, team.item(filled / len, filled % len, a));
      commit_fill();
      ++filled;
    };
    for (int n = 0; n < slots; ++n) fill();
    setup();
    float m = 0.f, amax = 0.f;
    for (int k = 0; k < total + len; ++k) {
      uint32_t old_max = 0;
      const bool reduce = k < total, last = reduce && k % len == len - 1;
      if (reduce) {  // fills issued: slots + max(0, k - len); wait for fill k
        wait_fills(slots - 1 - len);
        if constexpr (kMma) {
          m = fmaxf(m, mma_amax(slot(k % slots)));
        } else {
          tile.take(raw, slot(k % slots));
          m = fmaxf(m, local_amax(tile, raw, v, signs));
        }
        if (last) {
          m = cta_max<kWarps>(m, s_warp, (k / len) & 1);
          if (threadIdx.x == 0) old_max = head_max(a, team.group(k / len, a), m);
          m = 0.f;
        }
      }
      if (const int q = k - len; q >= 0) {
        if (q % len == 0) {
          const int g = team.group(q / len, a);
          amax = head_wait<kSharedWait>(a, g, s_head, (q / len) & 1);
          if (team.chunk == 0 && threadIdx.x == 0) a.descale[g] = descale_of<kHadamard, kD>(amax);
        }
        if constexpr (kMma) {
          Hm::values(slot(q % slots), Hm::tables(), v);
          mma_store(slot(q % slots), team.item(q / len, q % len, a), amax);
        } else {
          tile.take(raw, slot(q % slots));
          if constexpr (kHadamard) tile.values(raw, v, signs);
          quantize_store(tile, raw, v, a, team.item(q / len, q % len, a), amax);
        }
        fill();
      }
      if (last && threadIdx.x == 0) head_count(a, team.group(k / len, a), old_max);
    }
  } else {
    // Step s reduces this CTA's chunk of head s (tiles streamed through the ring) and, tile by
    // tile, quantizes its chunk of head s - 1, read again (from L2: it was read a step ago).
    const Team team(a);
    const int len = min(a.chunk_tiles, a.tiles - team.chunk * a.chunk_tiles);  // tiles of a chunk
    const int total = team.steps * len;
    int fill_s = 0, fill_t = 0;  // the next tile to fill: (head step, tile of the chunk)
    auto fill = [&](int i) {
      tile.fetch(slot(i), a, team.item(fill_s, fill_t, a));
      if (++fill_t == len) fill_t = 0, ++fill_s;
    };
    for (int n = 0; n < slots; ++n) {
      if (n < total) fill(n);
      commit_fill();
    }
    setup();
    auto head_amax = [&](int s) {
      const int g = team.group(s, a);
      const float amax = head_wait<kSharedWait>(a, g, s_head, s & 1);
      if (team.chunk == 0 && threadIdx.x == 0) a.descale[g] = descale_of<kHadamard, kD>(amax);
      return amax;
    };
    auto requantize = [&](int s, int t, float amax) {
      const Item it = team.item(s, t, a);
      tile.template load<true>(raw, a, it);
      if constexpr (kHadamard) tile.values(raw, v, signs);
      quantize_store(tile, raw, v, a, it, amax);
    };
    // The CTA counts itself in for head s as soon as its chunk is reduced (and one tile of head
    // s - 1 quantized), and waits for head s - 1 only after reducing one more tile: slack for
    // the team.
    float previous = 0.f;
    for (int s = 0, n = 0, i = 0; s < team.steps; ++s) {  // n: tiles reduced, i: tile n's slot
      float m = 0.f;
      for (int t = 0; t < len; ++t, ++n) {
        if (slots == 0) {
          tile.template load<false>(raw, a, team.item(s, t, a));
        } else {
          wait_fills(slots - 1);
          tile.take(raw, slot(i));
        }
        m = fmaxf(m, local_amax(tile, raw, v, signs));
        if (slots > 0) {
          if (n + slots < total) fill(i);
          commit_fill();
          i = next_slot(i);
        }
        uint32_t old_max = 0;
        if (t == len - 1) {
          m = cta_max<kWarps>(m, s_warp, s & 1);
          if (threadIdx.x == 0) old_max = head_max(a, team.group(s, a), m);
        }
        if (s > 0) {
          if (t == 0) previous = head_amax(s - 1);
          requantize(s - 1, t, previous);
        }
        if (t == len - 1 && threadIdx.x == 0) head_count(a, team.group(s, a), old_max);
      }
    }
    if (team.steps > 0) {
      const float last = head_amax(team.steps - 1);
      for (int t = 0; t < len; ++t) requantize(team.steps - 1, t, last);
    }
  }
}

}  // namespace flashcute
