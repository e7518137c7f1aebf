// Stage 3 staging layout and its CPU twin (collate.h).
#include "collate.h"

#include <string>

#include "loongforge/logging.h"

namespace loongforge {
namespace data {
namespace internal {
namespace {

size_t Align(size_t x) { return (x + 255) & ~size_t{255}; }

}  // namespace

CollateLayout CollateLayout::Make(int capacity_rows, int max_tokens, int state_dim, int action_dim,
                                  int horizon) {
  CollateLayout l{capacity_rows, max_tokens, state_dim, action_dim, horizon};
  const size_t r = static_cast<size_t>(capacity_rows);
  size_t p = 0;
  auto part = [&](size_t bytes) {
    size_t at = p;
    p += Align(bytes);
    return at;
  };
  l.off_src_row = part(sizeof(int32_t) * r);
  l.off_token_offset = part(sizeof(int32_t) * (r + 1));
  l.off_sample_index = part(sizeof(int64_t) * r);
  l.off_state = part(sizeof(float) * r * state_dim);
  l.off_action = part(sizeof(float) * r * horizon * action_dim);
  l.off_amask = part(r * horizon);
  l.off_norm = part(sizeof(float) * 2 * (state_dim + action_dim));
  l.off_tokens = part(sizeof(int32_t) * r * max_tokens);
  l.capacity_bytes = p;
  return l;
}

Status ValidateCollate(const CollateLayout& layout, const CollateDims& d) {
  if (d.n < 0 || d.n > d.rows || d.rows > layout.capacity_rows || d.len < 1)
    return InvalidArgumentError(
        "stage 3: n=" + std::to_string(d.n) + " rows=" + std::to_string(d.rows) +
        " len=" + std::to_string(d.len) + " do not fit a staging buffer of " +
        std::to_string(layout.capacity_rows) + " rows");
  return Status::Ok();
}

CollateParts CollatePartsOf(const CollateLayout& L, const uint8_t* raw) {
  CollateParts p;
  p.src_row = reinterpret_cast<const int32_t*>(raw + L.off_src_row);
  p.tok_off = reinterpret_cast<const int32_t*>(raw + L.off_token_offset);
  p.sample = reinterpret_cast<const int64_t*>(raw + L.off_sample_index);
  p.state = reinterpret_cast<const float*>(raw + L.off_state);
  p.action = reinterpret_cast<const float*>(raw + L.off_action);
  p.amask = raw + L.off_amask;
  p.norm = reinterpret_cast<const float*>(raw + L.off_norm);
  p.ids = reinterpret_cast<const int32_t*>(raw + L.off_tokens);
  p.state_dim = L.state_dim;
  p.action_dim = L.action_dim;
  p.horizon = L.horizon;
  return p;
}

void CollateReference(const CollateLayout& L, const uint8_t* raw, const CollateDims& d,
                      const CollateOut& out) {
  LF_CHECK(ValidateCollate(L, d).ok());
  const CollateParts p = CollatePartsOf(L, raw);
  for (int o = 0; o < d.rows; ++o) {
    if (o < d.n) LF_CHECK(p.src_row[o] >= 0 && p.src_row[o] < L.capacity_rows);
    CollateRow(p, d, out, o, /*lane=*/0, /*lanes=*/1);
  }
}

}  // namespace internal
}  // namespace data
}  // namespace loongforge
