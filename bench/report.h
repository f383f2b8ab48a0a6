// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: one measured row (what the table and the JSON line share), the
// exactness comparison and CUDA error bookkeeping.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "bench.h"
#include "device_util.h"

namespace fusedstep::bench {

enum class Exact { kUnknown, kNo, kYes };

struct Row {
  std::string op;        // mhc_boundary | kda_decode
  std::string shape;     // for the table, e.g. "H=5120 T=16"
  std::string schedule;  // the plan's resolved schedule
  int waves = 0;
  double fused_us = NAN;     // NaN = not measured (launch failed)
  double composed_us = NAN;
  int64_t bytes = 0;         // bytes that must move per launch
  int buffer_sets = 0;
  Exact exact = Exact::kUnknown;
  std::string note;          // why something is missing, or where the bits differ
};

// Why a path was not run: "not built yet: ..." for kUnsupported (or a missing entry
// point), "rejected: ..." for any other status.
std::string not_run(const char* what, const Result& result);

void print_table_header(const std::string& title);
// After an operation's table: says plainly whether its fused path ran (counts since
// the table began).
void print_op_status(const Context& ctx, const char* op, int measured_before, int not_run_before);
// Prints the row and, when the fused time was measured, writes its JSON line with
// the operation's shape fields already in `shape_fields`.
void emit_row(Context& ctx, const Options& options, const Row& row, JsonObject shape_fields);

// Returns true when `err` is cudaSuccess; otherwise records the failure in `ctx`
// (a sticky error stops all further measurements) and sets `note`.
bool cuda_ok(Context& ctx, cudaError_t err, const char* what, std::string* note);

// Compares `bytes` of two device buffers; on a difference appends
// "<name>: first difference at element i (a vs b)" to `note`. Returns false on a
// difference or a CUDA error (then `ok_cuda` is false).
bool same_bytes(const char* name, const void* a, const void* b, size_t bytes, size_t element_size,
                std::string* note, bool* ok_cuda);

}  // namespace fusedstep::bench
