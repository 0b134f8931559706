// Checks the Hopper backward's CTA order (cpp/bwd_tail_split.h) on the host: every CTA of a
// chunk gets a distinct tile, each pair's key blocks start in ascending order, and the causal
// tail follows its rules. Prints "ok" or the first failure.
#include <cstdio>
#include <vector>

#include "bwd_tail_split.h"

using flashcute::BwdTailSplit;

static int fail(const char* what, int pairs, int key_blocks, int sms, long long pair_bytes) {
  std::printf("%s: pairs %d, key blocks %d, sms %d, pair bytes %lld\n", what, pairs, key_blocks, sms, pair_bytes);
  return 1;
}

int main() {
  for (int pairs = 1; pairs <= 300; pairs += 7)
    for (int key_blocks = 1; key_blocks <= 140; key_blocks += 3)
      for (int sms : {132, 114, 7})
        for (long long pair_bytes : {0ll, 1ll << 20, 16ll << 20}) {
          BwdTailSplit split;
          split.key_blocks = key_blocks;
          split.full_tiles = pairs * key_blocks;
          flashcute::plan_causal_tail(split, pairs, sms, pair_bytes);
          const int tail = split.tail_pairs;
          if (tail != 0 && (key_blocks < 16 || tail < 2 || tail > pairs || split.tail_from != pairs - tail))
            return fail("tail outside its rules", pairs, key_blocks, sms, pair_bytes);
          if (tail > 2 && pair_bytes > 0 && tail * pair_bytes > (24ll << 20))
            return fail("tail beyond its L2 share", pairs, key_blocks, sms, pair_bytes);
          if (sms >= 100 && key_blocks >= 16 && pairs >= 2 && pair_bytes <= (8ll << 20) && tail == 0)
            return fail("no tail where one fits", pairs, key_blocks, sms, pair_bytes);
          std::vector<int> seen(split.ctas(), 0), next_block(pairs, 0);
          for (int cta = 0; cta < split.ctas(); ++cta) {
            const int t = split.work(cta).tile;
            if (t < 0 || t >= split.full_tiles || seen[t]++)
              return fail("tile out of range or repeated", pairs, key_blocks, sms, pair_bytes);
            if (t % key_blocks != next_block[t / key_blocks]++)
              return fail("a pair's key blocks out of order", pairs, key_blocks, sms, pair_bytes);
          }
          // The last CTAs are the tail pairs' last key blocks.
          if (tail > 0 && split.work(split.ctas() - 1).tile != pairs * key_blocks - 1)
            return fail("tail does not end on the last key block", pairs, key_blocks, sms, pair_bytes);
          if (tail > 0 && split.work(split.ctas() - 2).tile % key_blocks != key_blocks - 1)
            return fail("tail's last CTAs not all last key blocks", pairs, key_blocks, sms, pair_bytes);
        }
  std::printf("ok\n");
  return 0;
}
