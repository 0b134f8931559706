// Uses the installed flashcute library without a GPU: prints the build version, checks that
// an invalid forward and an invalid backward call are rejected with kInvalidArgument and a
// message (ALiBi's slopes among the reasons), asks for the backward's workspace size, and
// queries device 0.
// Exits 0 when the library behaves, 1 otherwise.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <flashcute/flashcute.h>

int main() {
  const flashcute::BuildInfo info = flashcute::build_info();
  std::printf("flashcute version: %s\n", info.version);
  std::printf("cuda archs: %s; ampere head dims: %s; ampere dtypes: %s\n", info.cuda_archs,
              info.ampere_head_dims, info.ampere_dtypes);

  // Valid sizes and strides but 3 query heads over 2 kv heads, and no data: must be rejected
  // by the argument checks before any device is touched.
  flashcute::AttentionForwardParams params;
  params.batch = 1;
  params.seqlen_q = 16;
  params.seqlen_k = 16;
  params.nheads = 3;
  params.nheads_kv = 2;
  params.headdim = 64;
  params.q_row_stride = params.nheads * params.headdim;
  params.q_head_stride = params.headdim;
  params.q_batch_stride = params.seqlen_q * params.q_row_stride;
  params.k_row_stride = params.v_row_stride = params.nheads_kv * params.headdim;
  params.k_head_stride = params.v_head_stride = params.headdim;
  params.k_batch_stride = params.v_batch_stride = params.seqlen_k * params.k_row_stride;
  params.out_row_stride = params.q_row_stride;
  params.out_head_stride = params.q_head_stride;
  params.out_batch_stride = params.q_batch_stride;
  params.softmax_scale = 0.125f;
  params.dtype = flashcute::DType::kFloat16;

  const flashcute::Status status = flashcute::attention_forward(params);
  if (status.code != flashcute::StatusCode::kInvalidArgument || status.message[0] == '\0') {
    std::printf("FAIL: expected kInvalidArgument with a message, got code %d: '%s'\n",
                static_cast<int>(status.code), status.message);
    return 1;
  }
  std::printf("invalid call rejected: %s\n", status.message);

  // ALiBi's slopes, on a call that is valid otherwise (host pointers: the checks fail before
  // any device is touched): a negative batch stride, a batch stride without slopes, and a
  // misaligned pointer are each rejected by name.
  alignas(16) static unsigned char buffer[1 << 16];
  flashcute::AttentionForwardParams alibi = params;
  alibi.nheads = alibi.nheads_kv = 2;
  alibi.q = alibi.k = alibi.v = buffer;
  alibi.out = buffer + (1 << 15);
  struct Case {
    const float* slopes;
    int64_t batch_stride;
    const char* name;
  };
  const Case cases[] = {
      {nullptr, -1, "alibi_slopes_batch_stride: "},
      {nullptr, 2, "alibi_slopes: "},
      {reinterpret_cast<const float*>(buffer + (1 << 15) - 2), 0, "alibi_slopes: "},
  };
  for (const Case& c : cases) {
    alibi.alibi_slopes = c.slopes;
    alibi.alibi_slopes_batch_stride = c.batch_stride;
    const flashcute::Status s = flashcute::attention_forward(alibi);
    if (s.code != flashcute::StatusCode::kInvalidArgument ||
        std::strncmp(s.message, c.name, std::strlen(c.name)) != 0) {
      std::printf("FAIL: expected kInvalidArgument naming %s got code %d: '%s'\n", c.name,
                  static_cast<int>(s.code), s.message);
      return 1;
    }
  }
  std::printf("invalid alibi slopes rejected\n");

  // The backward: 16 queries × 2 heads need 128 padded rows × 2 heads of fp32 row sums; both
  // paths add a 128 × 64 fp32 dQ accumulator per head, the Hopper path also lse_log2 rows.
  // deterministic=true runs the Ampere path's atomic-free design, which needs the row sums
  // only. A call without pointers is rejected.
  flashcute::AttentionBackwardParams bwd;
  bwd.batch = 1;
  bwd.seqlen_q = 16;
  bwd.seqlen_k = 16;
  bwd.nheads = 2;
  bwd.nheads_kv = 2;
  bwd.headdim = 64;
  bwd.softmax_scale = 0.125f;
  const bool hopper_bwd = std::strstr(info.hopper_backward_head_dims, "64") != nullptr &&
                          std::strstr(info.hopper_dtypes, "float16") != nullptr;
  const size_t rows_bytes = 128 * 2 * sizeof(float);
  const size_t accum_bytes = 2 * 128 * 64 * sizeof(float);
  const size_t ampere_bytes = rows_bytes + accum_bytes;
  const size_t ready_bytes = 16;  // dq_ready: 2 (batch, kv head) pairs, padded to 16 bytes
  const size_t hopper_bytes = hopper_bwd ? 2 * rows_bytes + ready_bytes + accum_bytes : ampere_bytes;
  size_t workspace_bytes = 0, hopper_workspace_bytes = 0, deterministic_bytes = 0;
  const flashcute::Status sized =
      flashcute::attention_backward_workspace_size(bwd, &workspace_bytes, flashcute::Backend::kAmpere);
  const flashcute::Status hopper_sized =
      flashcute::attention_backward_workspace_size(bwd, &hopper_workspace_bytes, flashcute::Backend::kHopper);
  bwd.deterministic = true;
  const flashcute::Status deterministic_sized =
      flashcute::attention_backward_workspace_size(bwd, &deterministic_bytes, flashcute::Backend::kAmpere);
  bwd.deterministic = false;
  if (!sized.ok() || workspace_bytes != ampere_bytes || !hopper_sized.ok() ||
      hopper_workspace_bytes != hopper_bytes || !deterministic_sized.ok() || deterministic_bytes != rows_bytes) {
    std::printf("FAIL: workspace sizes %zu / %zu / %zu (expected %zu / %zu / %zu), status %d: '%s'\n",
                workspace_bytes, hopper_workspace_bytes, deterministic_bytes, ampere_bytes, hopper_bytes,
                rows_bytes, static_cast<int>(sized.code), sized.message);
    return 1;
  }
  const flashcute::Status rejected = flashcute::attention_backward(bwd);
  if (rejected.code != flashcute::StatusCode::kInvalidArgument || rejected.message[0] == '\0') {
    std::printf("FAIL: expected kInvalidArgument from the backward, got code %d: '%s'\n",
                static_cast<int>(rejected.code), rejected.message);
    return 1;
  }
  std::printf("backward workspace: %zu bytes (deterministic: %zu); invalid backward rejected: %s\n",
              workspace_bytes, deterministic_bytes, rejected.message);

  int capability = -1;
  const flashcute::Status device = flashcute::device_capability(0, &capability);
  if (device.ok()) {
    std::printf("device 0: sm%d\n", capability);
  } else if (device.code == flashcute::StatusCode::kNoDevice && device.message[0] != '\0') {
    std::printf("no device: %s\n", device.message);
  } else {
    std::printf("FAIL: device_capability(0) gave code %d: '%s'\n", static_cast<int>(device.code),
                device.message);
    return 1;
  }
  return 0;
}
