// Which kernel runs a call: the one dispatch policy behind attention_forward, attention_backward,
// their workspace queries and every front end (through choose_kernel). Pure: it reads a
// catalogue of compiled kernels and a compute capability, never the device, so tests can run it
// on stand-in builds. Messages name the argument that decides, as the front ends raise them.
#pragma once

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "flashcute/flashcute.h"
#include "launch_status.h"
#include "hopper/fwd_config.h"
#include "paged_kernels.h"

namespace flashcute {

// One path's compiled kernels.
struct KernelFamily {
  std::vector<int> head_dims;           // forward
  std::vector<int> backward_head_dims;  // backward
  std::vector<DType> dtypes;
  std::vector<std::pair<int, int>> pairs;  // forward (head dim, V head dim) kernels, d != dv
  std::vector<int> fp8_head_dims;          // FP8 (e4m3) forward kernels (Hopper path)
};

struct KernelCatalogue {
  KernelFamily ampere, hopper;
  // Ampere-path head dims built without sm90 code (FLASHCUTE_AMPERE_SM90_HEAD_DIMS): an sm90 GPU
  // cannot run their kernels, so loadable_on() leaves them out there.
  std::vector<int> ampere_sm80_only;
  const KernelFamily& of(Backend b) const { return b == Backend::kHopper ? hopper : ampere; }
};

// The kernels a GPU of `capability` runs: on sm90, the Ampere path without its sm80-only head
// dims (their calls round up to a kernel with sm90 code). Other GPUs load sm80 code or PTX,
// which every head dim has.
inline KernelCatalogue loadable_on(const KernelCatalogue& c, int capability) {
  KernelCatalogue v = c;
  v.ampere_sm80_only.clear();
  if (capability != 90) return v;
  auto drop = [&](std::vector<int>& dims) {
    dims.erase(std::remove_if(dims.begin(), dims.end(),
                              [&](int d) {
                                return std::find(c.ampere_sm80_only.begin(), c.ampere_sm80_only.end(), d) !=
                                       c.ampere_sm80_only.end();
                              }),
               dims.end());
  };
  drop(v.ampere.head_dims);
  drop(v.ampere.backward_head_dims);
  if (v.ampere.head_dims.empty()) v.ampere.dtypes.clear();
  return v;
}

namespace dispatch_detail {

inline const char* name(Backend b) { return b == Backend::kHopper ? "hopper" : "ampere"; }
inline const char* title(Backend b) { return b == Backend::kHopper ? "Hopper" : "Ampere"; }
inline const char* dtype_name(DType d) {
  return d == DType::kBFloat16    ? "bfloat16"
         : d == DType::kFloat32   ? "float32"
         : d == DType::kFloat8E4M3 ? "float8_e4m3fn"
                                  : "float16";
}
inline Backend other(Backend b) { return b == Backend::kHopper ? Backend::kAmpere : Backend::kHopper; }

// sm90a kernels run on sm90 only; the Ampere path on sm80 and newer.
inline bool runs_on(Backend b, int capability) {
  return b == Backend::kHopper ? capability == 90 : capability >= 80;
}

inline std::string sm(int capability) { return "sm" + std::to_string(capability); }

inline std::string join(const std::vector<int>& values) {
  std::string s;
  for (int v : values) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s;
}

inline const std::vector<int>& dims(const KernelCatalogue& c, Backend b, bool backward) {
  return backward ? c.of(b).backward_head_dims : c.of(b).head_dims;
}

// The smallest compiled head dim at least `headdim` (a positive multiple of 8), or 0.
inline int smallest_at_least(const std::vector<int>& compiled, int headdim) {
  if (headdim <= 0 || headdim % 8 != 0) return 0;
  int best = 0;
  for (int d : compiled)
    if (d >= headdim && (best == 0 || d < best)) best = d;
  return best;
}

// Whether the default path `preferred` keeps a call that the other path runs too. The Hopper
// path does unless its kernel is more than twice as wide as the Ampere path's: on an H200 it
// ran hd 32 (on hd 64 kernels) 1.1-1.4x and hd 96 / 192 backward (on 128 / 256) 1.2-1.7x
// faster than the Ampere path's exact kernels (benchmarks/results/h200-rounded-head-dims.txt).
// The Ampere path keeps it unless the other kernel is narrower.
inline bool keeps_default(const KernelCatalogue& c, Backend preferred, int headdim, bool backward) {
  const int mine = smallest_at_least(dims(c, preferred, backward), headdim);
  const int theirs = smallest_at_least(dims(c, other(preferred), backward), headdim);
  if (headdim == 0 || theirs == 0) return true;
  return preferred == Backend::kHopper ? mine <= 2 * theirs : mine <= theirs;
}

// Why path `b` cannot run this head dim and dtype in this build, or "" if it can.
inline std::string not_compiled(const KernelCatalogue& c, Backend b, const KernelQuery& r, bool check_headdim) {
  const auto& d = dims(c, b, r.backward);
  const char* what = r.backward ? "backward " : "";
  if (d.empty() || c.of(b).dtypes.empty())
    return std::string("the ") + title(b) + " path has no " + what + "kernels in this build";
  if (check_headdim && r.headdim != 0 && (r.headdim < 0 || r.headdim % 8 != 0))
    return "head dim " + std::to_string(r.headdim) + " is not a positive multiple of 8";
  if (check_headdim && r.headdim != 0 && smallest_at_least(d, r.headdim) == 0)
    return "head dim " + std::to_string(r.headdim) + " has no " + what + "kernel in this build (compiled: " +
           join(d) + "; a head dim runs on the smallest compiled one at least as large)";
  const auto& types = c.of(b).dtypes;
  if (!r.any_dtype && std::find(types.begin(), types.end(), r.dtype) == types.end()) {
    std::string compiled;
    for (DType t : types) compiled += (compiled.empty() ? "" : ", ") + std::string(dtype_name(t));
    return std::string("dtype ") + dtype_name(r.dtype) + " is not compiled in this build (compiled: " + compiled + ")";
  }
  return "";
}

inline Status refuse(const std::string& message) { return make_status(StatusCode::kNotSupported, "%s", message.c_str()); }

}  // namespace dispatch_detail

// The default path on a GPU of `capability`: the Hopper path on sm90 where it was built.
inline Backend default_backend_of(const KernelCatalogue& c, int capability) {
  return capability == 90 && !c.hopper.head_dims.empty() ? Backend::kHopper : Backend::kAmpere;
}

// The kernel head dims (d, dv) that run a call on path `b`, or {0, 0}. Forward pairs: the pair
// kernel at least as large in both with the smallest sum; a backward whose V head dim differs
// runs on the backward kernel at least as large as both.
inline std::pair<int, int> kernel_head_dims(const KernelCatalogue& c, Backend b, int headdim, int headdim_v,
                                            bool backward) {
  using namespace dispatch_detail;
  if (headdim_v == 0 || headdim_v == headdim) {
    const int k = smallest_at_least(dims(c, b, backward), headdim);
    return {k, k};
  }
  if (backward) {
    const int k = smallest_at_least(dims(c, b, true), std::max(headdim, headdim_v));
    return {k, k};
  }
  if (smallest_at_least({headdim}, headdim) == 0 || smallest_at_least({headdim_v}, headdim_v) == 0) return {0, 0};
  std::pair<int, int> best{0, 0};
  for (const auto& p : c.of(b).pairs)
    if (p.first >= headdim && p.second >= headdim_v &&
        (best.first == 0 || p.first + p.second < best.first + best.second ||
         (p.first + p.second == best.first + best.second && p < best)))
      best = p;
  return best;
}

namespace dispatch_detail {

// What the Hopper path compiles for calls whose V head dim differs, for messages.
inline std::string pairs_text(const KernelCatalogue& c, bool backward) {
  if (backward) {
    const auto& d = c.hopper.backward_head_dims;
    return "backward head dims " + (d.empty() ? std::string("none") : join(d)) +
           ", one at least as large as both head dims";
  }
  std::string s;
  for (const auto& p : c.hopper.pairs)
    s += (s.empty() ? "" : ", ") + ("(" + std::to_string(p.first) + ", " + std::to_string(p.second) + ")");
  return "pairs " + (s.empty() ? std::string("none") : s);
}

// A call whose V head dim differs from q's: only the Hopper path's kernels run it, on sm90.
inline Status choose_pair(const KernelCatalogue& c, const KernelQuery& r, Backend requested, int capability,
                          Backend* chosen) {
  const std::string what = "v: head dim " + std::to_string(r.headdim_v) + " differs from q's and k's " +
                           std::to_string(r.headdim) + "; only the Hopper path runs such calls (compiled: " +
                           pairs_text(c, r.backward) + ")";
  if (requested == Backend::kAmpere) return refuse(what + ", not backend='ampere'");
  if (!runs_on(Backend::kHopper, capability)) return refuse(what + ", on an sm90 GPU; this is " + sm(capability));
  if (kernel_head_dims(c, Backend::kHopper, r.headdim, r.headdim_v, r.backward).first == 0)
    return refuse(what + "; this build has none for (" + std::to_string(r.headdim) + ", " +
                  std::to_string(r.headdim_v) + ")");
  if (std::string why = not_compiled(c, Backend::kHopper, r, false); !why.empty())
    return refuse("backend='hopper': " + why);
  *chosen = Backend::kHopper;
  return Status{};
}

// FP8 (e4m3) calls: the Hopper path's FP8 forward, on sm90, one head dim, no KV cache.
inline Status choose_fp8(const KernelCatalogue& c, const KernelQuery& r, Backend requested, int capability,
                         KernelChoice* choice) {
  const auto& d = c.hopper.fp8_head_dims;
  if (r.backward)
    return refuse("q: float8_e4m3fn has no backward kernel (FP8 is forward-only)");
  if (r.kv_cache) return refuse("q: float8_e4m3fn KV-cache calls have no kernel (FP8 runs attention only)");
  if (requested == Backend::kAmpere)
    return refuse("backend='ampere': FP8 (float8_e4m3fn) runs on the Hopper path only, which needs an sm90 GPU");
  if (!runs_on(Backend::kHopper, capability))
    return refuse("q: FP8 (float8_e4m3fn) needs the Hopper path, on an sm90 GPU; this is " + sm(capability));
  if (r.headdim_v != 0 && r.headdim_v != r.headdim)
    return refuse("v: head dim " + std::to_string(r.headdim_v) + " differs from q's and k's " +
                  std::to_string(r.headdim) + "; FP8 calls need one head dim");
  if (d.empty()) return refuse("q: this build has no FP8 (float8_e4m3fn) kernels");
  const int k = r.headdim == 0 ? d.front() : smallest_at_least(d, static_cast<int>(r.headdim));
  if (k == 0)
    return refuse("head dim " + std::to_string(r.headdim) + " has no FP8 kernel in this build (compiled: " + join(d) +
                  "; a head dim runs on the smallest compiled one at least as large)");
  *choice = KernelChoice{Backend::kHopper, k, k};
  return Status{};
}

inline Status too_old(int capability) {
  return make_status(StatusCode::kNoDevice, "flashcute needs an sm80 or newer GPU (Ampere, Ada, Hopper); this is %s",
                     sm(capability).c_str());
}

inline Status choose_forward(const KernelCatalogue& c, const KernelQuery& r, Backend requested, int capability,
                             Backend* chosen) {
  if (requested == Backend::kAuto && capability < 80) return too_old(capability);
  if (r.headdim != 0 && r.headdim_v != 0 && r.headdim_v != r.headdim)
    return choose_pair(c, r, requested, capability, chosen);
  if (requested == Backend::kAuto) {
    // The default path, else the other; the other also where keeps_default says so.
    const Backend preferred = default_backend_of(c, capability);
    const bool preferred_runs = runs_on(preferred, capability) && not_compiled(c, preferred, r, true).empty();
    const bool other_runs =
        runs_on(other(preferred), capability) && not_compiled(c, other(preferred), r, true).empty();
    if (preferred_runs || other_runs) {
      *chosen = preferred_runs && (!other_runs || keeps_default(c, preferred, r.headdim, r.backward))
                    ? preferred
                    : other(preferred);
      return Status{};
    }
    return refuse(std::string("backend='") + name(preferred) + "' (the default on " + sm(capability) +
                  "): " + not_compiled(c, preferred, r, true));
  }
  KernelQuery any = r;  // first: whether the path has kernels at all
  any.any_dtype = true;
  std::string why = not_compiled(c, requested, any, false);
  if (why.empty() && !runs_on(requested, capability))
    why = std::string("requires ") + (requested == Backend::kHopper ? "an sm90 GPU" : "an sm80 or newer GPU") +
          ", this is " + sm(capability);
  if (why.empty()) why = not_compiled(c, requested, r, true);
  if (!why.empty()) return refuse(std::string("backend='") + name(requested) + "': " + why);
  *chosen = requested;
  return Status{};
}

// The backward: the Hopper path on sm90 where it compiles the head dim (rounded up) and dtype,
// unless keeps_default() gives it to the Ampere path; deterministic calls on the Ampere path, whose
// atomic-free design alone is bitwise reproducible.
inline Status choose_backward(const KernelCatalogue& c, const KernelQuery& r, Backend requested, int capability,
                              Backend* chosen) {
  if (r.headdim_v != 0 && r.headdim_v != r.headdim) {
    if (requested == Backend::kAuto && capability < 80) return too_old(capability);
    if (r.deterministic && requested != Backend::kHopper)
      return refuse("v: head dim " + std::to_string(r.headdim_v) + " differs from q's and k's " +
                    std::to_string(r.headdim) +
                    "; only the Hopper-path backward runs such calls, which adds dQ with atomics: "
                    "deterministic=True has no kernel for them");
    if (!r.deterministic) return choose_pair(c, r, requested, capability, chosen);
  }
  if (requested == Backend::kHopper) {
    if (r.deterministic)
      return refuse("backend='hopper': its backward adds dQ with atomics and is not bitwise reproducible; "
                    "deterministic=True runs on backend=None or 'ampere'");
    std::string why = runs_on(Backend::kHopper, capability) ? "" : "requires an sm90 GPU, this is " + sm(capability);
    if (why.empty()) why = not_compiled(c, Backend::kHopper, r, true);
    if (!why.empty()) return refuse("backend='hopper': " + why);
    *chosen = Backend::kHopper;
    return Status{};
  }
  if (requested == Backend::kAuto && capability < 80) return too_old(capability);
  if (requested == Backend::kAuto && !r.deterministic && runs_on(Backend::kHopper, capability) &&
      default_backend_of(c, capability) == Backend::kHopper && not_compiled(c, Backend::kHopper, r, true).empty() &&
      (!not_compiled(c, Backend::kAmpere, r, true).empty() || keeps_default(c, Backend::kHopper, r.headdim, true))) {
    *chosen = Backend::kHopper;
    return Status{};
  }
  KernelQuery forward = r;  // the Ampere path's backward compiles its forward's head dims
  forward.backward = false;
  return choose_forward(c, forward, Backend::kAmpere, capability, chosen);
}

// Query rows per sequence from which a KV-cache call runs on the Hopper path (measured:
// benchmarks/results/h100-kvcache-prefill.txt). Below, decoding and short chunks run the
// Ampere path's kernels, whose split-KV and packed query heads serve few rows.
constexpr int64_t kKvCacheHopperRows = 128;

// A prefill against a paged cache copies the cache's used rows into a contiguous workspace
// first (kv_gather.h) when the copy costs little beside the forward: pages that the Hopper
// path's TMA boxes cannot read, or read in boxes shorter than 64 rows (measured at 0.60-0.90 of a
// contiguous cache), at least kKvCacheCopyRows query rows per K/V head (the copy moves a key
// once, the forward reads it once per query tile), and a workspace of at most kKvCacheCopyBytes
// (the whole capacity of every sequence). Measured: benchmarks/results/h100-kvcache-prefill.txt.
constexpr int64_t kKvCacheCopyRows = 1024;
constexpr int64_t kKvCacheCopyBytes = int64_t(256) << 20;

// Rows of the Hopper path's TMA boxes for pages of page_size keys on the kernel of head dim
// kernel_headdim: gcd(page size, keys per block) (hopper/fwd_paged_kv.h); 0 for no such kernel.
inline int64_t hopper_page_box_rows(int kernel_headdim, int64_t page_size) {
  const int64_t block_n = hopper::fwd_tile_size(kernel_headdim).block_n;
  return block_n > 0 && page_size > 0 ? std::gcd(page_size, block_n) : 0;
}

// The path a KV-cache call runs on, as a request to choose_forward, and whether it copies the
// pages: the Hopper path for prefill-sized calls on sm90 where it compiles the head dim (and
// keeps_default() keeps it) and its TMA loads read the pages (paged_kernels.h) or the pages are
// copied; else the Ampere path, which reads every page size. An explicit 'hopper' copies pages its
// loads cannot read where a workspace is allowed, and is refused for them otherwise.
inline Status choose_kvcache(const KernelCatalogue& c, const KernelQuery& r, Backend requested, int capability,
                             Backend* path, bool* copies) {
  *copies = false;
  const int64_t page_size = r.paged_kv ? std::max<int64_t>(r.page_size, 1) : 0;
  const bool hopper_runs = runs_on(Backend::kHopper, capability) && not_compiled(c, Backend::kHopper, r, true).empty();
  const auto hopper_kernel = hopper_runs ? kernel_head_dims(c, Backend::kHopper, static_cast<int>(r.headdim),
                                                            static_cast<int>(r.headdim), false)
                                         : std::pair<int, int>{0, 0};
  const bool pages_fit = hopper_kernel.first > 0 &&
                         hopper_reads_pages(hopper_kernel.first, hopper_kernel.second, page_size);
  const int64_t block_n = hopper::fwd_tile_size(hopper_kernel.first).block_n;
  const bool short_boxes = pages_fit && page_size > 0 &&
                           hopper_page_box_rows(hopper_kernel.first, page_size) < std::min<int64_t>(64, block_n);
  const bool copy_allowed = hopper_kernel.first > 0 && page_size > 0 && (!pages_fit || short_boxes) &&
                            r.kv_copy_bytes > 0 && r.kv_copy_bytes <= kKvCacheCopyBytes;
  const bool copy_pays = copy_allowed && r.kv_seqlen_q * std::max<int64_t>(r.kv_group, 1) >= kKvCacheCopyRows;
  const bool ampere_runs = runs_on(Backend::kAmpere, capability) && not_compiled(c, Backend::kAmpere, r, true).empty();
  // Pages the boxes cannot read, on the Hopper path by request or for want of the Ampere path's
  // kernels: copied whatever the rows.
  const bool hopper_only = requested == Backend::kAuto && !ampere_runs && default_backend_of(c, capability) == Backend::kHopper;
  if ((requested == Backend::kHopper || hopper_only) && !pages_fit && copy_allowed) {
    *path = Backend::kHopper, *copies = true;
    return Status{};
  }
  if (hopper_kernel.first > 0 && !pages_fit &&
      (requested == Backend::kHopper || (requested == Backend::kAuto && !ampere_runs)))
    return refuse("page_table: the Hopper path reads pages of a multiple of 16 keys on kernels of head dims that "
                  "are multiples of 64, and copies other pages only into a workspace of at most " +
                  std::to_string(kKvCacheCopyBytes >> 20) + " MiB that the caller's framework can allocate (this "
                  "call: page size " + std::to_string(page_size) +
                  ", kernel head dim " + std::to_string(hopper_kernel.first) + ")" +
                  (ampere_runs ? "; pass backend=None or 'ampere'" : "; this build has no Ampere-path kernel for it"));
  if (requested != Backend::kAuto) {
    *path = requested;  // choose_forward names what else is missing
    *copies = requested == Backend::kHopper && copy_pays;
    return Status{};
  }
  const bool prefill = r.kv_seqlen_q >= kKvCacheHopperRows;
  const bool head_dim_fits = keeps_default(c, Backend::kHopper, static_cast<int>(r.headdim), false);
  const bool hopper = default_backend_of(c, capability) == Backend::kHopper && (pages_fit || copy_pays) &&
                      (!ampere_runs || (prefill && head_dim_fits));
  *path = hopper ? Backend::kHopper : Backend::kAmpere;
  *copies = hopper && copy_pays;
  return Status{};
}

}  // namespace dispatch_detail

// The path and kernel head dims that run a request on a GPU of `capability`, or the reason none
// does (kNotSupported naming the argument; kNoDevice for a GPU older than sm80).
inline Status choose_kernel_in(const KernelCatalogue& c, const KernelQuery& query, Backend requested, int capability,
                            KernelChoice* choice) {
  if (!c.ampere_sm80_only.empty())  // kernel_registry.cpp hands over catalogues loadable_on() already
    return choose_kernel_in(loadable_on(c, capability), query, requested, capability, choice);
  // Head dims as the policy compares them: no kernel is near 2^20, and messages stay readable.
  KernelQuery r = query;
  r.headdim = std::min<int64_t>(std::max<int64_t>(r.headdim, -1), 1 << 20);
  r.headdim_v = std::min<int64_t>(std::max<int64_t>(r.headdim_v, -1), 1 << 20);
  if (requested != Backend::kAuto && requested != Backend::kAmpere && requested != Backend::kHopper)
    return make_status(StatusCode::kInvalidArgument, "backend: expected kAuto, kAmpere or kHopper");
  if (!r.any_dtype && r.dtype == DType::kFloat8E4M3) {
    if (requested == Backend::kAuto && capability < 80) return dispatch_detail::too_old(capability);
    return dispatch_detail::choose_fp8(c, r, requested, capability, choice);
  }
  bool copies_pages = false;
  if (r.kv_cache) {
    if (r.headdim_v != 0 && r.headdim_v != r.headdim)
      return dispatch_detail::refuse("v_cache: head dim " + std::to_string(r.headdim_v) + " differs from q's and k_cache's " +
                    std::to_string(r.headdim) + "; KV-cache calls need one head dim");
    if (requested == Backend::kAuto && capability < 80) return dispatch_detail::too_old(capability);
    r.backward = false;
    const Status s = dispatch_detail::choose_kvcache(c, r, requested, capability, &requested, &copies_pages);
    if (!s.ok()) return s;
  }
  Backend chosen = Backend::kAmpere;
  const Status s = r.backward ? dispatch_detail::choose_backward(c, r, requested, capability, &chosen)
                              : dispatch_detail::choose_forward(c, r, requested, capability, &chosen);
  if (!s.ok()) return s;
  auto k = kernel_head_dims(c, chosen, r.headdim, r.headdim_v, r.backward);
  if (r.kv_cache && r.paged_kv && chosen == Backend::kAmpere && !has_paged_loads(k.first)) {  // the next kernel up with paged loads
    const auto& dims = c.ampere.head_dims;  // sorted
    const auto it = std::find_if(dims.begin(), dims.end(), [&](int d) { return d >= r.headdim && has_paged_loads(d); });
    if (it == dims.end())
      return dispatch_detail::refuse("page_table: paged KV caches run on Ampere-path kernels of head dim above 64; "
                                     "this build compiles head dims " + dispatch_detail::join(dims));
    k = {*it, *it};
  }
  *choice = KernelChoice{chosen, k.first, k.second, copies_pages && chosen == Backend::kHopper};
  return Status{};
}

}  // namespace flashcute
