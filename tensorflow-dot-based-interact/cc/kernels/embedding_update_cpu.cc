// CPU kernels of EmbeddingSparseSgd, EmbeddingSparseAdam, EmbeddingSparseAdagrad,
// EmbeddingSparseRmsprop and EmbeddingSparseFtrl (registered in cc/ops/embedding_update_ops.cc).
//
// TensorFlow applies a sparse step with one single-threaded scatter per table (plus separate ops
// for the learning-rate product and, for Adam, the moment gathers and scatters). Here one op
// takes every table of the step: all variables are locked once (in mutex address order, as
// TensorFlow's own multi-variable ops do), every index is checked before anything is written,
// and the work is cut into parts that own disjoint rows (row % parts, parts a power of two), so the intra-op threads
// update tables, and parts of large tables, in parallel without two threads on one row. A rule
// that also touches every row first (Keras legacy RMSprop's decay of the whole rms slot) does that
// pass in blocks over the same threads before the sparse step.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/util/work_sharder.h"

namespace embedding_update {
namespace {

using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::Var;
using Workers = tensorflow::DeviceBase::CpuWorkerThreads;
namespace errors = tensorflow::errors;

// A part should hold at least this many gradient elements to be worth a thread of its own.
constexpr int64_t kMinElementsPerPart = 1 << 15;

// One table's update: the table and its slot rows, the touched rows and their gradients.
struct TableWork {
  float* table = nullptr;
  float* slots[2] = {nullptr, nullptr};  // per the rule's slot lists
  int64_t rows = 0;
  int64_t dim = 0;
  const int64_t* indices = nullptr;
  const float* gradients = nullptr;
  int64_t count = 0;
  int64_t parts = 1;
};

// The variables of one call, looked up from the named resource input lists and held locked
// until the update is done.
class LockedVariables {
 public:
  Status Acquire(OpKernelContext* context, const std::vector<std::string>& lists) {
    for (const std::string& list : lists) {
      int start = 0, stop = 0;
      TF_RETURN_IF_ERROR(context->op_kernel().InputRange(list, &start, &stop));
      for (int input = start; input < stop; ++input) {
        tensorflow::core::RefCountPtr<Var> variable;
        TF_RETURN_IF_ERROR(tensorflow::LookupResource(context, tensorflow::HandleFromInput(context, input), &variable));
        variables_.push_back(std::move(variable));
      }
    }
    std::vector<Var*> order;
    for (const auto& variable : variables_) order.push_back(variable.get());
    std::sort(order.begin(), order.end(), [](Var* a, Var* b) { return a->mu() < b->mu(); });
    if (std::adjacent_find(order.begin(), order.end()) != order.end()) {
      return errors::InvalidArgument("the same variable is passed twice (as two tables, or as a table and a slot); "
                                     "each table and slot must be its own variable");
    }
    for (Var* variable : order) {
      variable->mu()->lock();
      locked_.push_back(variable);
    }
    return tensorflow::OkStatus();
  }

  ~LockedVariables() {
    for (auto it = locked_.rbegin(); it != locked_.rend(); ++it) (*it)->mu()->unlock();
  }

  // Variable `table` of input list number `list` (0: tables, 1.. the slots), of `tables` per list.
  Var* at(int list, int table, int tables) const { return variables_[list * tables + table].get(); }

 private:
  std::vector<tensorflow::core::RefCountPtr<Var>> variables_;
  std::vector<Var*> locked_;
};

// The variable's buffer, made safe to write in place: a buffer still shared with a tensor read
// before sparse mode began is copied first, and reads copy from now on (copy-on-read mode).
Status WritableBuffer(OpKernelContext* context, Var* variable, float** data) {
  Tensor* tensor = variable->tensor();
  if (!variable->copy_on_read_mode.load() && !tensor->RefCountIsOne()) {
    Tensor copy;
    TF_RETURN_IF_ERROR(context->allocate_temp(tensor->dtype(), tensor->shape(), &copy));
    std::memcpy(copy.data(), tensor->data(), tensor->TotalBytes());
    *tensor = copy;
  }
  variable->copy_on_read_mode.store(true);
  *data = tensor->flat<float>().data();
  return tensorflow::OkStatus();
}

// Checks table `table` (its slots, indices and gradients) and describes its update.
Status DescribeTable(OpKernelContext* context, const LockedVariables& variables, int num_slots, int table,
                     int tables, const Tensor& indices, const Tensor& gradients, int num_threads, TableWork* work) {
  Var* variable = variables.at(0, table, tables);
  const Tensor& values = *variable->tensor();
  if (!variable->is_initialized || values.dtype() != tensorflow::DT_FLOAT || values.dims() != 2) {
    return errors::InvalidArgument("table ", table, " must be an initialized float32 variable of rank 2, got ",
                                   variable->DebugString());
  }
  work->rows = values.dim_size(0);
  work->dim = values.dim_size(1);
  for (int slot = 0; slot < num_slots; ++slot) {
    Var* slot_variable = variables.at(slot + 1, table, tables);
    if (!slot_variable->is_initialized || slot_variable->tensor()->dtype() != tensorflow::DT_FLOAT ||
        slot_variable->tensor()->shape() != values.shape()) {
      return errors::InvalidArgument("slot ", slot, " of table ", table, " must be a float32 variable of shape ",
                                     values.shape().DebugString(), ", got ", slot_variable->DebugString());
    }
  }
  if (!tensorflow::TensorShapeUtils::IsVector(indices.shape()) || gradients.dims() != 2 ||
      gradients.dim_size(0) != indices.NumElements() || gradients.dim_size(1) != work->dim) {
    return errors::InvalidArgument("table ", table, " [", work->rows, ", ", work->dim, "]: indices ",
                                   indices.shape().DebugString(), " and gradients ", gradients.shape().DebugString(),
                                   " do not match (want [n] and [n, ", work->dim, "])");
  }
  work->indices = indices.flat<int64_t>().data();
  work->gradients = gradients.flat<float>().data();
  work->count = indices.NumElements();
  for (int64_t j = 0; j < work->count; ++j) {
    if (work->indices[j] < 0 || work->indices[j] >= work->rows) {
      return errors::InvalidArgument("index ", work->indices[j], " (position ", j, ") of table ", table,
                                     " is outside [0, ", work->rows, ")");
    }
  }
  const int64_t wanted = std::max<int64_t>(1, std::min<int64_t>(2 * num_threads, work->count * work->dim / kMinElementsPerPart));
  work->parts = 1;
  while (2 * work->parts <= wanted) work->parts *= 2;  // a power of two: a part's rows are a mask away
  return tensorflow::OkStatus();
}

// Rows this far ahead in a part are prefetched (table and slot rows), so that several random
// rows are in flight from memory while one is updated.
constexpr size_t kPrefetchDistance = 6;

void PrefetchRow(const TableWork& work, int num_slots, int64_t row) {
  const int64_t bytes = work.dim * static_cast<int64_t>(sizeof(float));
  for (int64_t offset = 0; offset < bytes; offset += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(work.table + row * work.dim) + offset, 1);
    for (int slot = 0; slot < num_slots; ++slot) {
      __builtin_prefetch(reinterpret_cast<const char*>(work.slots[slot] + row * work.dim) + offset, 1);
    }
  }
}

// Applies `rule` to the rows of one part of a table: gradients one by one in index order, or,
// when the rule needs each row once (Rule::kSumsRepeatedRows), to the sum of a row's gradients
// (summed in index order). Repeated rows are found with a hash table of each row's first entry,
// every entry linking to the next entry of its row (no sort).
template <class Rule>
void UpdatePart(const TableWork& work, int64_t part, const Rule& rule) {
  std::vector<std::pair<int64_t, int64_t>> mine;  // (row, position)
  mine.reserve(work.count / work.parts + 16);
  const int64_t mask = work.parts - 1;
  for (int64_t j = 0; j < work.count; ++j) {
    if ((work.indices[j] & mask) == part) mine.emplace_back(work.indices[j], j);
  }
  const int64_t dim = work.dim;
  if (!Rule::kSumsRepeatedRows) {
    for (size_t k = 0; k < mine.size(); ++k) {
      if (k + kPrefetchDistance < mine.size()) PrefetchRow(work, Rule::kSlots, mine[k + kPrefetchDistance].first);
      rule.Apply(work, mine[k].first, work.gradients + mine[k].second * dim);
    }
    return;
  }
  int shift = 64 - 4;  // capacity 2^(64 - shift) >= 2 entries per slot
  while ((uint64_t{1} << (64 - shift)) < 2 * mine.size()) --shift;
  const uint64_t capacity_mask = (uint64_t{1} << (64 - shift)) - 1;
  std::vector<int64_t> first_entry(capacity_mask + 1, -1);  // hash slot -> the entry where its row first appears
  std::vector<int64_t> next(mine.size(), -1), last(mine.size());  // next entry of the row; the row's latest entry
  std::vector<int64_t> firsts;  // entries where a row first appears, in index order
  firsts.reserve(mine.size());
  for (size_t k = 0; k < mine.size(); ++k) {
    // The rows of a part share their low bits: Fibonacci hashing takes the product's high bits.
    uint64_t slot = (static_cast<uint64_t>(mine[k].first) * 0x9E3779B97F4A7C15ull) >> shift;
    while (first_entry[slot] >= 0 && mine[first_entry[slot]].first != mine[k].first) slot = (slot + 1) & capacity_mask;
    if (first_entry[slot] < 0) {
      first_entry[slot] = last[k] = k;
      firsts.push_back(k);
    } else {
      next[last[first_entry[slot]]] = k;
      last[first_entry[slot]] = k;
    }
  }
  std::vector<float> sum(dim);
  for (size_t i = 0; i < firsts.size(); ++i) {
    if (i + kPrefetchDistance < firsts.size()) PrefetchRow(work, Rule::kSlots, mine[firsts[i + kPrefetchDistance]].first);
    int64_t k = firsts[i];
    std::memcpy(sum.data(), work.gradients + mine[k].second * dim, dim * sizeof(float));
    for (k = next[k]; k >= 0; k = next[k]) {
      const float* gradient = work.gradients + mine[k].second * dim;
      for (int64_t d = 0; d < dim; ++d) sum[d] += gradient[d];
    }
    rule.Apply(work, mine[firsts[i]].first, sum.data());
  }
}

Status ReadScalar(OpKernelContext* context, const char* name, float* value) {
  const Tensor* tensor = nullptr;
  TF_RETURN_IF_ERROR(context->input(name, &tensor));
  if (!tensorflow::TensorShapeUtils::IsScalar(tensor->shape())) {
    return errors::InvalidArgument(name, " must be a scalar, got shape ", tensor->shape().DebugString());
  }
  *value = tensor->scalar<float>()();
  return tensorflow::OkStatus();
}

struct SgdRule {
  static constexpr int kSlots = 0;
  static constexpr const char* kSlotLists[] = {nullptr};
  static constexpr bool kSumsRepeatedRows = false;
  float learning_rate = 0;

  Status Read(OpKernelContext* context) { return ReadScalar(context, "learning_rate", &learning_rate); }

  void Apply(const TableWork& work, int64_t row, const float* gradient) const {
    float* values = work.table + row * work.dim;
    for (int64_t d = 0; d < work.dim; ++d) values[d] -= learning_rate * gradient[d];
  }
};

struct AdamRule {
  static constexpr int kSlots = 2;
  static constexpr const char* kSlotLists[] = {"first_moments", "second_moments"};
  static constexpr bool kSumsRepeatedRows = true;
  float step_size = 0, beta_1 = 0, beta_2 = 0, epsilon = 0;

  Status Read(OpKernelContext* context) {
    TF_RETURN_IF_ERROR(ReadScalar(context, "step_size", &step_size));
    TF_RETURN_IF_ERROR(ReadScalar(context, "beta_1", &beta_1));
    TF_RETURN_IF_ERROR(ReadScalar(context, "beta_2", &beta_2));
    return ReadScalar(context, "epsilon", &epsilon);
  }

  void Apply(const TableWork& work, int64_t row, const float* gradient) const {
    float* values = work.table + row * work.dim;
    float* m = work.slots[0] + row * work.dim;
    float* v = work.slots[1] + row * work.dim;
    for (int64_t d = 0; d < work.dim; ++d) {
      m[d] = beta_1 * m[d] + (1.0f - beta_1) * gradient[d];
      v[d] = beta_2 * v[d] + (1.0f - beta_2) * gradient[d] * gradient[d];
      values[d] -= step_size * m[d] / (std::sqrt(v[d]) + epsilon);
    }
  }
};

struct AdagradRule {
  static constexpr int kSlots = 1;
  static constexpr const char* kSlotLists[] = {"accumulators"};
  static constexpr bool kSumsRepeatedRows = true;
  float learning_rate = 0, epsilon = 0;

  Status Read(OpKernelContext* context) {
    TF_RETURN_IF_ERROR(ReadScalar(context, "learning_rate", &learning_rate));
    return ReadScalar(context, "epsilon", &epsilon);
  }

  void Apply(const TableWork& work, int64_t row, const float* gradient) const {
    float* values = work.table + row * work.dim;
    float* accumulator = work.slots[0] + row * work.dim;
    for (int64_t d = 0; d < work.dim; ++d) {
      accumulator[d] += gradient[d] * gradient[d];
      values[d] -= learning_rate * gradient[d] / (std::sqrt(accumulator[d]) + epsilon);
    }
  }
};

// Keras legacy RMSprop without momentum, not centered (TF 2.4's, which the W&D reference ran):
// after the whole rms slot has decayed (DecayBeforeUpdate), rms += g^2 (1 - rho) and
// table -= lr g / (sqrt(rms) + epsilon) on each distinct touched row, g the sum of its gradients.
struct RmspropRule {
  static constexpr int kSlots = 1;
  static constexpr const char* kSlotLists[] = {"rms"};
  static constexpr bool kSumsRepeatedRows = true;
  float learning_rate = 0, rho = 0, one_minus_rho = 0, epsilon = 0;

  Status Read(OpKernelContext* context) {
    TF_RETURN_IF_ERROR(ReadScalar(context, "learning_rate", &learning_rate));
    TF_RETURN_IF_ERROR(ReadScalar(context, "rho", &rho));
    one_minus_rho = 1.0f - rho;  // in float32, as Keras computes it
    return ReadScalar(context, "epsilon", &epsilon);
  }

  void Apply(const TableWork& work, int64_t row, const float* gradient) const {
    float* values = work.table + row * work.dim;
    float* rms = work.slots[0] + row * work.dim;
    for (int64_t d = 0; d < work.dim; ++d) {
      rms[d] += gradient[d] * gradient[d] * one_minus_rho;
      values[d] -= learning_rate * gradient[d] / (std::sqrt(rms[d]) + epsilon);
    }
  }
};

// FTRL-proximal as TensorFlow's ApplyFtrl computes it, on each distinct touched row.
struct FtrlRule {
  static constexpr int kSlots = 2;
  static constexpr const char* kSlotLists[] = {"accumulators", "linears"};
  static constexpr bool kSumsRepeatedRows = true;
  float learning_rate = 0, l1 = 0, l2 = 0, power = 0;  // power: -learning_rate_power

  Status Read(OpKernelContext* context) {
    float learning_rate_power = 0;
    TF_RETURN_IF_ERROR(ReadScalar(context, "learning_rate", &learning_rate));
    TF_RETURN_IF_ERROR(ReadScalar(context, "l1", &l1));
    TF_RETURN_IF_ERROR(ReadScalar(context, "l2", &l2));
    TF_RETURN_IF_ERROR(ReadScalar(context, "learning_rate_power", &learning_rate_power));
    if (!(learning_rate > 0) || !(l1 >= 0) || !(l2 >= 0) || !(learning_rate_power <= 0)) {
      return errors::InvalidArgument("FTRL needs learning_rate > 0, l1 >= 0, l2 >= 0 and learning_rate_power <= 0, "
                                     "got ", learning_rate, ", ", l1, ", ", l2, ", ", learning_rate_power);
    }
    power = -learning_rate_power;
    return tensorflow::OkStatus();
  }

  float Power(float x) const { return power == 0.5f ? std::sqrt(x) : std::pow(x, power); }

  void Apply(const TableWork& work, int64_t row, const float* gradient) const {
    float* values = work.table + row * work.dim;
    float* accumulator = work.slots[0] + row * work.dim;
    float* linear = work.slots[1] + row * work.dim;
    for (int64_t d = 0; d < work.dim; ++d) {
      const float updated = accumulator[d] + gradient[d] * gradient[d];
      const float updated_power = Power(updated);
      linear[d] += gradient[d] - (updated_power - Power(accumulator[d])) / learning_rate * values[d];
      const float clipped = std::min(std::max(linear[d], -l1), l1);
      values[d] = (clipped - linear[d]) / (updated_power / learning_rate + 2.0f * l2);
      accumulator[d] = updated;
    }
  }
};

// Work on every row of the slots before the sparse step: none, except for RMSprop.
template <class Rule>
void DecayBeforeUpdate(const Rule&, const std::vector<TableWork>&, const Workers&) {}

// Elements of an rms slot decayed by one unit of work.
constexpr int64_t kDecayBlock = 1 << 16;

// RMSprop: rms = rho * rms on every row of every table, blocks of the slots spread over the threads.
void DecayBeforeUpdate(const RmspropRule& rule, const std::vector<TableWork>& work, const Workers& workers) {
  std::vector<std::pair<float*, int64_t>> blocks;  // (first element, length)
  for (const TableWork& table : work) {
    const int64_t size = table.rows * table.dim;
    for (int64_t start = 0; start < size; start += kDecayBlock) {
      blocks.emplace_back(table.slots[0] + start, std::min(kDecayBlock, size - start));
    }
  }
  tensorflow::Shard(workers.num_threads, workers.workers, blocks.size(), 2 * kDecayBlock,
                    [&](int64_t begin, int64_t end) {
                      for (int64_t block = begin; block < end; ++block) {
                        float* rms = blocks[block].first;
                        for (int64_t i = 0; i < blocks[block].second; ++i) rms[i] *= rule.rho;
                      }
                    });
}

template <class Rule>
class EmbeddingSparseUpdateOp : public OpKernel {
 public:
  explicit EmbeddingSparseUpdateOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    Rule rule;
    OP_REQUIRES_OK(context, rule.Read(context));
    OpInputList indices, gradients;
    OP_REQUIRES_OK(context, context->input_list("indices", &indices));
    OP_REQUIRES_OK(context, context->input_list("gradients", &gradients));
    const int tables = indices.size();
    std::vector<std::string> lists = {"tables"};
    for (int slot = 0; slot < Rule::kSlots; ++slot) lists.push_back(Rule::kSlotLists[slot]);
    LockedVariables variables;
    OP_REQUIRES_OK(context, variables.Acquire(context, lists));

    const auto& workers = *context->device()->tensorflow_cpu_worker_threads();
    std::vector<TableWork> work(tables);
    std::vector<std::pair<int, int64_t>> units;  // (table, part)
    int64_t elements = 0;
    for (int table = 0; table < tables; ++table) {
      OP_REQUIRES_OK(context, DescribeTable(context, variables, Rule::kSlots, table, tables, indices[table],
                                            gradients[table], workers.num_threads, &work[table]));
      for (int64_t part = 0; part < work[table].parts; ++part) units.emplace_back(table, part);
      elements += work[table].count * work[table].dim;
    }
    for (int table = 0; table < tables; ++table) {  // only once every check has passed
      OP_REQUIRES_OK(context, WritableBuffer(context, variables.at(0, table, tables), &work[table].table));
      for (int slot = 0; slot < Rule::kSlots; ++slot) {
        OP_REQUIRES_OK(context, WritableBuffer(context, variables.at(slot + 1, table, tables), &work[table].slots[slot]));
      }
    }
    DecayBeforeUpdate(rule, work, workers);
    const int64_t cost_per_unit = units.empty() ? 0 : 4 * (1 + Rule::kSlots) * elements / units.size();
    tensorflow::Shard(workers.num_threads, workers.workers, units.size(), cost_per_unit,
                      [&](int64_t begin, int64_t end) {
                        for (int64_t unit = begin; unit < end; ++unit) {
                          UpdatePart(work[units[unit].first], units[unit].second, rule);
                        }
                      });
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbeddingSparseSgd").Device(tensorflow::DEVICE_CPU), EmbeddingSparseUpdateOp<SgdRule>);
REGISTER_KERNEL_BUILDER(Name("EmbeddingSparseAdam").Device(tensorflow::DEVICE_CPU), EmbeddingSparseUpdateOp<AdamRule>);
REGISTER_KERNEL_BUILDER(Name("EmbeddingSparseAdagrad").Device(tensorflow::DEVICE_CPU),
                        EmbeddingSparseUpdateOp<AdagradRule>);
REGISTER_KERNEL_BUILDER(Name("EmbeddingSparseRmsprop").Device(tensorflow::DEVICE_CPU),
                        EmbeddingSparseUpdateOp<RmspropRule>);
REGISTER_KERNEL_BUILDER(Name("EmbeddingSparseFtrl").Device(tensorflow::DEVICE_CPU), EmbeddingSparseUpdateOp<FtrlRule>);

}  // namespace
}  // namespace embedding_update
