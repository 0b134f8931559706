// Checks the Hopper forward's unit decode (cpp/hopper/tile_scheduler.h) on the host: the
// multiply-based TileSchedule::unit against plain division, unit_tiles against each unit's
// count, and that the units cover every (query block, head, batch) tile exactly once (pairs:
// blocks M-1-p and p). Host code only; prints "ok" or the first failure.
#include <cstdio>
#include <vector>

#include "hopper/tile_scheduler.h"

using flashcute::hopper::FwdUnit;
using flashcute::hopper::TileSchedule;

// The decode spelled out with divisions: groups of group_size (batch, head) pairs, rank-major
// inside a group, then the tail units (middle blocks, or every head's last block).
static FwdUnit by_division(const TileSchedule& s, int index) {
  const int ranks = s.paired ? s.num_m_blocks / 2 : s.num_m_blocks - (s.last_block_last ? 1 : 0);
  int rank, head_batch;
  if (index < s.num_head_batch * ranks) {
    const int group = index / (s.group_size * ranks);
    const int in_group = index % (s.group_size * ranks);
    const int first = group * s.group_size;
    const int heads = s.num_head_batch - first < s.group_size ? s.num_head_batch - first : s.group_size;
    rank = in_group / heads;
    head_batch = first + in_group % heads;
  } else {
    rank = ranks;
    head_batch = index - s.num_head_batch * ranks;
  }
  FwdUnit u;
  u.head = head_batch % s.nheads;
  u.batch = head_batch / s.nheads;
  u.m_blocks[0] = s.paired ? s.num_m_blocks - 1 - rank : rank;
  u.m_blocks[1] = rank;
  u.count = s.paired && u.m_blocks[0] != rank ? 2 : 1;
  return u;
}

static int fail(const char* what, int m, int h, int b, int g, bool paired, bool last, int index) {
  std::printf("%s: m_blocks %d, nheads %d, batch %d, group %d, paired %d, last_block_last %d, unit %d\n", what, m, h,
              b, g, int(paired), int(last), index);
  return 1;
}

static int check(int m, int h, int b, int g, bool paired, bool last) {
  const TileSchedule s = TileSchedule::make(m, h, b, g, paired, last);
  std::vector<int> seen(static_cast<size_t>(m) * h * b, 0);
  for (int i = 0; i < s.num_units; ++i) {
    const FwdUnit u = s.unit(i), r = by_division(s, i);
    if (u.head != r.head || u.batch != r.batch || u.count != r.count || u.m_blocks[0] != r.m_blocks[0] ||
        (u.count == 2 && u.m_blocks[1] != r.m_blocks[1]))
      return fail("decode differs from division", m, h, b, g, paired, last, i);
    if (s.unit_tiles(i) != u.count) return fail("unit_tiles differs from the unit's count", m, h, b, g, paired, last, i);
    for (int part = 0; part < u.count; ++part) {
      const int mb = u.tile(part).m_block;
      if (mb < 0 || mb >= m || u.head < 0 || u.head >= h || u.batch < 0 || u.batch >= b)
        return fail("tile out of range", m, h, b, g, paired, last, i);
      ++seen[(static_cast<size_t>(u.batch) * h + u.head) * m + mb];
    }
  }
  for (int c : seen)
    if (c != 1) return fail("a tile run other than once", m, h, b, g, paired, last, -1);
  return 0;
}

int main() {
  for (int m : {1, 2, 3, 4, 5, 8, 13, 64, 129})
    for (int h : {1, 3, 8, 32})
      for (int b : {1, 2, 5})
        for (int g : {1, 2, 3, 7, 16, 200})
          for (bool paired : {false, true})
            for (bool last : {false, true})
              if (check(m, h, b, g, paired, last)) return 1;
  if (check(4096, 64, 2, 37, true, false) || check(3000, 5, 9, 11, false, true)) return 1;
  std::printf("ok\n");
  return 0;
}
