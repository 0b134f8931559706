// Uses the installed flashcute library without a GPU: prints the build version, checks that
// an invalid call is rejected with kInvalidArgument and a message, and queries device 0.
// Exits 0 when the library behaves, 1 otherwise.
#include <cstdio>

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
