// What the two packers share (pack_common.h).
#include "dataset/pack_common.h"

#include <cmath>

#include "loongforge/pack.h"

namespace loongforge::data {

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "records are little-endian; add byte swapping for big-endian hosts"
#endif

Status CheckSharedPackOptions(int horizon, int threads, int max_instruction_bytes) {
  if (horizon < 1 || horizon > 4096)
    return InvalidArgumentError("pack: horizon must be in 1..4096, got " + std::to_string(horizon));
  if (threads < 0 || threads > kMaxPackThreads)
    return InvalidArgumentError("pack: threads must be in 0.." + std::to_string(kMaxPackThreads) +
                                " (0 = all cores), got " + std::to_string(threads));
  if (max_instruction_bytes < 1 || max_instruction_bytes > kMaxInstructionBytesLimit)
    return InvalidArgumentError("pack: max_instruction_bytes must be in 1.." +
                                std::to_string(kMaxInstructionBytesLimit) + ", got " +
                                std::to_string(max_instruction_bytes));
  return Status::Ok();
}

StatusOr<std::vector<int32_t>> EncodeChecked(const Tokenizer& tokenizer, const std::string& text,
                                             const std::string& what) {
  std::vector<int32_t> ids = tokenizer.Encode(text);
  const int vocab = tokenizer.vocab_size();
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      return InvalidArgumentError("tokenizer '" + tokenizer.id() + "' returned token id " +
                                  std::to_string(id) + ", outside its vocabulary [0, " +
                                  std::to_string(vocab) + "), for " + what);
  return ids;
}

void ComputeStats(const std::vector<const float*>& rows, size_t dims, std::vector<float>* mean,
                  std::vector<float>* std_out, std::vector<float>* min_out,
                  std::vector<float>* max_out) {
  std::vector<double> sum(dims, 0), m2(dims, 0);
  min_out->assign(dims, INFINITY);
  max_out->assign(dims, -INFINITY);
  for (const float* r : rows)
    for (size_t d = 0; d < dims; ++d) {
      sum[d] += r[d];
      (*min_out)[d] = std::min((*min_out)[d], r[d]);
      (*max_out)[d] = std::max((*max_out)[d], r[d]);
    }
  const double n = static_cast<double>(rows.size());
  mean->resize(dims);
  for (size_t d = 0; d < dims; ++d) sum[d] /= n;
  for (const float* r : rows)
    for (size_t d = 0; d < dims; ++d) {
      const double x = r[d] - sum[d];
      m2[d] += x * x;
    }
  std_out->resize(dims);
  for (size_t d = 0; d < dims; ++d) {
    (*mean)[d] = static_cast<float>(sum[d]);
    (*std_out)[d] = static_cast<float>(std::sqrt(m2[d] / n));
  }
}

Status PutSample(RecordWriter* writer, int64_t id, const std::vector<std::string>& cameras,
                 const SampleRecords& records, int64_t* jpeg_bytes) {
  LF_RETURN_IF_ERROR(writer->Put(SampleKey(id, "action"), records.action));
  LF_RETURN_IF_ERROR(writer->Put(SampleKey(id, "amask"), records.amask));
  for (size_t c = 0; c < cameras.size(); ++c) {
    LF_RETURN_IF_ERROR(writer->Put(SampleKey(id, CameraModality(cameras[c])), records.jpegs[c]));
    *jpeg_bytes += static_cast<int64_t>(records.jpegs[c].size());
  }
  if (!records.lerobot.empty())
    LF_RETURN_IF_ERROR(writer->Put(SampleKey(id, "lerobot"), records.lerobot));
  LF_RETURN_IF_ERROR(writer->Put(SampleKey(id, "meta"), records.meta));
  LF_RETURN_IF_ERROR(writer->Put(SampleKey(id, "state"), records.state));
  LF_RETURN_IF_ERROR(writer->Put(SampleKey(id, "task"), records.task));
  return writer->Put(SampleKey(id, "tokens"), records.tokens);
}

}  // namespace loongforge::data
