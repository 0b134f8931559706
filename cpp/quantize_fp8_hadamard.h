// quantize_fp8's Hadamard transform on tensor cores (sm_90 code of the block and held walks):
// Y = X·H_kD for a tile in a ring slot, unnormalized Sylvester H, with H_kD = H_C ⊗ H_32 over
// C = kD / 32 chunks of 32 columns. Each 32-column chunk of a row goes through H_32 as one
// column of m16n8k16 MMAs' B operand (eight chunk-rows side by side, read by ldmatrix and
// sign-flipped there). A holds H_32's rows in the order π(r + 16y) = 2·(r % 8) + r / 8 + 16y
// (r < 16), so that a thread's accumulators hold two pairs of neighbouring output columns, and
// all four 16 x 16 blocks of A are its first one, the last negated (through B). H_C then runs
// in the thread's registers, which hold every chunk of their rows. Those kernels issue fewer
// instructions per value than Tile::values' butterflies and shuffles, which bound them
// (benchmarks/results/h200-quantize-fp8-hadamard-mma.txt). The caller, quantize_fp8.h,
// includes this after Tile, Divisor and the e4m3 helpers it uses.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace flashcute::quantize_fp8_detail {

template <class T, int kD>
struct HadamardMma {
  static_assert(sizeof(T) == 2, "16-bit inputs");
  static constexpr int kChunks = kD / 32;
  static constexpr int kRows = 1024 / kD;  // a warp's rows: those its lanes copy (Tile::row)
  static constexpr uint32_t kOne = std::is_same_v<T, __half> ? 0x3C00u : 0x3F80u;  // 1.0; bit 15 negates
  using Tl = Tile<T, kD, true, true>;

  // Column n (0..7) of MMA group G (0..3): a warp-local row and a chunk, so that thread q
  // (lane % 4), whose accumulators hold columns 2q and 2q + 1, has every chunk of its rows.
  static __host__ __device__ constexpr int row_of(int G, int n) {
    return kD == 64 ? 8 * (G >> 1) + n : kD == 128 ? n : n >> 1;
  }
  static __host__ __device__ constexpr int chunk_of(int G, int n) {
    return kD == 64 ? (G & 1) : kD == 128 ? G : 2 * G + (n & 1);
  }

  // Per lane: A's first block's fragment (a) and the sign masks of B's fragments (sign[G]).
  struct Tables {
    uint4 a[32];
    uint4 sign[4][32];
    int4 unit[2][32];  // per warp parity: the lane's ldmatrix row per group (lane_unit)
  };

  // The CTA's tables (shared memory only in kernels that use them).
  static __device__ __forceinline__ Tables& tables() {
    __shared__ Tables t;
    return t;
  }

  // By the CTA's first 128 threads; neg_bits: bit j of word j / 32 set where column j is negated.
  static __device__ void fill(Tables& t, const uint32_t* neg_bits) {
    const int i = int(threadIdx.x);
    if (i >= 128) return;
    const int quad = i / 32, lane = i % 32, g = lane / 4, q = lane % 4;
    uint32_t r[4];
    if (quad == 0) {
      // a0..a3: (row g, col 2q), (g + 8, 2q), (g, 2q + 8), (g + 8, 2q + 8), elements at columns
      // c and c + 1: H_32[π(row)][col].
      for (int e = 0; e < 4; ++e) {
        const int m = g + 8 * (e & 1), k = 2 * q + 8 * (e >> 1);
        const int row = 2 * (m % 8) + m / 8;  // π(m)
        r[e] = (kOne | uint32_t(__popc(row & k) & 1) << 15) | (kOne | uint32_t(__popc(row & (k + 1)) & 1) << 15) << 16;
      }
      t.a[lane] = make_uint4(r[0], r[1], r[2], r[3]);
    }
    // B register j of group G: columns 8j + 2q and + 1 of chunk chunk_of(G, g).
    for (int j = 0; j < 4; ++j) {
      const int col = 32 * chunk_of(quad, g) + 8 * j + 2 * q;
      const uint32_t bits = neg_bits[col / 32] >> (col % 32);
      r[j] = ((bits & 1u) << 15) | ((bits & 2u) << 30);
    }
    t.sign[quad][lane] = make_uint4(r[0], r[1], r[2], r[3]);
    if (quad < 2)
      t.unit[quad][lane] = make_int4(lane_unit(quad, lane, 0), lane_unit(quad, lane, 1), lane_unit(quad, lane, 2),
                                     lane_unit(quad, lane, 3));
  }

  // The 16-byte unit of a slot, counted from the warp's first row (warp w: w·kRows·kD/8 units
  // on; only its parity moves the swizzle), where a lane of warp w reads the ldmatrix row of
  // group G: row n = lane % 8 of matrix lane / 8 (columns 8·(lane / 8).. of the chunk).
  static __device__ int lane_unit(int w, int lane, int G) {
    const int n = lane % 8, j = lane / 8, r = w * kRows + row_of(G, n);
    return Tl::slot_index(r, 4 * chunk_of(G, n) + j) - w * kRows * (kD / 8);
  }

  static __device__ __forceinline__ void mma(float (&c)[4], const uint4& a, uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<T, __half>) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
    }
  }

  // The thread's 32 transformed values of the tile in `slot` (filled and visible to the warp):
  // v[8G + 4b + j] is row row_of(G, 2q + b) of the warp, column 32·chunk_of(G, b) + 2g +
  // (j & 1) + 16·(j >> 1).
  static __device__ __forceinline__ void values(const uint4* slot, const Tables& t, float (&v)[32]) {
    const int lane = int(threadIdx.x) % 32, w = int(threadIdx.x) / 32;
    const uint32_t base = uint32_t(__cvta_generic_to_shared(slot + w * kRows * (kD / 8)));
    const uint4 a = t.a[lane];
    const int4 u = t.unit[w & 1][lane];
    const int unit[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int G = 0; G < 4; ++G) {
      uint32_t b[4];
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                   : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                   : "r"(base + 16u * uint32_t(unit[G]))
                   : "memory");
      const uint4 s = t.sign[G][lane];
      b[0] ^= s.x, b[1] ^= s.y, b[2] ^= s.z, b[3] ^= s.w;
      // Output columns < 16 of the chunk take A's first block for both k-blocks, the others
      // negate the second (π moves bit 4 of a row to bit 4 of its column).
      float c[2][4] = {};
      mma(c[0], a, b[0], b[1]);
      mma(c[0], a, b[2], b[3]);
      mma(c[1], a, b[0], b[1]);
      mma(c[1], a, b[2] ^ 0x80008000u, b[3] ^ 0x80008000u);
#pragma unroll
      for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int e = 0; e < 4; ++e) v[8 * G + 4 * (e & 1) + 2 * mb + (e >> 1)] = c[mb][e];
    }
    // H_C: a butterfly per chunk bit h between the values of one row and column whose chunks
    // differ in h (the lower chunk keeps the sum), all in the thread.
#pragma unroll
    for (int h = 1; h < kChunks; h *= 2)
#pragma unroll
      for (int G = 0; G < 4; ++G)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          if (chunk_of(G, b) & h) continue;
          const int G2 = kD == 256 ? (h == 1 ? G : G | (h >> 1)) : G | h, b2 = kD == 256 && h == 1 ? 1 : b;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float x = v[8 * G + 4 * b + j], y = v[8 * G2 + 4 * b2 + j];
            v[8 * G + 4 * b + j] = x + y, v[8 * G2 + 4 * b2 + j] = x - y;
          }
        }
  }

  // Byte offset of the warp's staged row ρ, column col: rows kPitch bytes apart, an odd
  // multiple of 32 bytes per two rows (hd 256: per row), so that the four rows one store writes
  // fall on different banks; linear, so that the offsets of a thread's stores are immediates.
  static constexpr int kPitch = kD == 256 ? 288 : kD == 128 ? 144 : 80;
  static_assert(kRows * kPitch <= kRows * 2 * kD, "staged rows fit the warp's rows of the slot");
  static __device__ __forceinline__ int staged(int rho, int col) { return rho * kPitch + col; }

  // Quantizes v and stores it: each thread's pairs of neighbouring bytes go through the warp's
  // own rows of the slot (already read), then out in 16-byte row pieces.
  template <bool kPrescale>
  static __device__ __forceinline__ void store(const float (&v)[32], uint4* slot, const QuantizeFp8Args& a,
                                               const Item& it, const Divisor& d) {
    const int t = int(threadIdx.x), lane = t % 32, w = t / 32, g = lane / 4, q = lane % 4;
    char* stage = reinterpret_cast<char*>(slot + w * kRows * (kD / 8));
    __syncwarp();  // every lane's ldmatrix reads of these rows before any lane's writes
#pragma unroll
    for (int G = 0; G < 4; ++G)
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const float* u = &v[8 * G + 4 * b + 2 * p];
          const uint16_t pair = uint16_t(e4m3x2(scaled<kPrescale, false>(u[0], d), scaled<kPrescale, false>(u[1], d)));
          *reinterpret_cast<uint16_t*>(stage + staged(row_of(G, 2 * q + b), 32 * chunk_of(G, b) + 2 * g + 16 * p)) = pair;
        }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int k = lane + 32 * i, rho = k / (kD / 16), col = 16 * (k % (kD / 16));
      const uint4 bytes = *reinterpret_cast<const uint4*>(stage + staged(rho, col));
      const int r = it.row0 + w * kRows + rho;
      if (r < a.seqlen)
        __stcs(reinterpret_cast<uint4*>(a.out + ((int64_t(it.b) * a.seqlen + r) * a.nheads + it.h) * kD + col), bytes);
    }
    __syncwarp();  // the slot's next fill, by the warp's own lanes, after every lane's reads
  }
};

}  // namespace flashcute::quantize_fp8_detail
