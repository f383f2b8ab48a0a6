// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: table rows, JSON lines, exactness comparison.
#include "report.h"

#include <cstdio>
#include <cstring>
#include <vector>

namespace fusedstep::bench {

void print_table_header(const std::string& title) {
  std::printf("\n%s\n", title.c_str());
  std::printf("%-13s %-26s %-28s %5s %10s %11s %8s %9s %9s %7s  %s\n", "op", "shape", "schedule",
              "waves", "fused_us", "composed_us", "speedup", "MB", "floor_us", "%copy", "exact");
}

std::string not_run(const char* what, const Result& result) {
  const bool unbuilt = result.status() == Status::kUnsupported;
  return std::string(unbuilt ? "not built yet: " : "rejected: ") + what + ": " + describe(result);
}

void print_op_status(const Context& ctx, const char* op, int measured_before, int not_run_before) {
  const int measured = ctx.rows_measured - measured_before;
  const int not_run = ctx.rows_not_run - not_run_before;
  if (measured == 0 && not_run > 0) {
    std::printf("%s: fused path not built yet (or rejected) on every shape: no fused numbers; "
                "see the notes above\n", op);
  } else if (not_run > 0) {
    std::printf("%s: fused path measured on %d shapes, not run on %d (notes above)\n", op, measured,
                not_run);
  }
}

static const char* exact_text(Exact e) {
  return e == Exact::kYes ? "yes" : e == Exact::kNo ? "NO" : "-";
}

void emit_row(Context& ctx, const Options& options, const Row& row, JsonObject shape_fields) {
  const double mb = row.bytes / 1e6;
  const double floor_us = ctx.copy_gbps > 0 ? row.bytes / (ctx.copy_gbps * 1e3) : NAN;
  const double pct = std::isfinite(row.fused_us) && ctx.copy_gbps > 0
                         ? 100.0 * floor_us / row.fused_us
                         : NAN;
  const double speedup = row.composed_us / row.fused_us;
  char fused[32] = "-", composed[32] = "-", speed[32] = "-", pct_text[32] = "-";
  if (std::isfinite(row.fused_us)) std::snprintf(fused, sizeof fused, "%.2f", row.fused_us);
  if (std::isfinite(row.composed_us)) std::snprintf(composed, sizeof composed, "%.2f", row.composed_us);
  if (std::isfinite(speedup)) std::snprintf(speed, sizeof speed, "%.2fx", speedup);
  if (std::isfinite(pct)) std::snprintf(pct_text, sizeof pct_text, "%.1f%%", pct);
  std::printf("%-13s %-26s %-28s %5d %10s %11s %8s %9.2f %9.2f %7s  %s%s%s\n", row.op.c_str(),
              row.shape.c_str(), row.schedule.c_str(), row.waves, fused, composed, speed, mb,
              floor_us, pct_text, exact_text(row.exact), row.note.empty() ? "" : "  ",
              row.note.c_str());
  std::fflush(stdout);
  if (row.exact == Exact::kNo) ++ctx.failures;
  if (row.exact == Exact::kYes) ++ctx.rows_exact;
  if (std::isfinite(row.fused_us)) {
    ++ctx.rows_measured;
  } else {
    ++ctx.rows_not_run;
  }
  if (ctx.json == nullptr || !std::isfinite(row.fused_us)) return;  // numbers only for real runs

  JsonObject& o = shape_fields;
  o.add("context", "bench");  // back-to-back calls; the layer-context rows say "layer"
  o.add("schedule", row.schedule).add("waves", row.waves).add("fused_us", row.fused_us);
  if (std::isfinite(row.composed_us)) {
    o.add("composed_us", row.composed_us).add("speedup", speedup);
  } else {
    o.add_null("composed_us").add_null("speedup");
  }
  o.add("bytes", row.bytes).add("gbps", row.bytes / (row.fused_us * 1e3)).add("floor_us", floor_us).add("copy_gbps", ctx.copy_gbps)
      .add("pct_copy_bw", pct);
  if (row.exact == Exact::kUnknown) {
    o.add_null("exact");
  } else {
    o.add("exact", row.exact == Exact::kYes);
  }
  if (!row.note.empty()) o.add("note", row.note);
  o.add("pdl", options.pdl).add("buffer_sets", row.buffer_sets).add("iters", options.iters)
      .add("gpu", ctx.gpu_name).add("commit", ctx.commit).add("date", ctx.date)
      .add("seed", static_cast<int64_t>(ctx.seed));
  ctx.json->write(o);
}

bool cuda_ok(Context& ctx, cudaError_t err, const char* what, std::string* note) {
  if (err == cudaSuccess) return true;
  ++ctx.failures;
  // Out of memory leaves the context usable; anything else after a kernel ran
  // (illegal address, launch failure) poisons it.
  if (err != cudaErrorMemoryAllocation) ctx.cuda_broken = true;
  (void)cudaGetLastError();
  if (note) {
    if (!note->empty()) *note += "; ";
    *note += std::string(what) + ": " + cudaGetErrorName(err);
  }
  return false;
}

bool same_bytes(const char* name, const void* a, const void* b, size_t bytes, size_t element_size,
                std::string* note, bool* ok_cuda) {
  std::vector<unsigned char> ha(bytes), hb(bytes);
  cudaError_t err = cudaMemcpy(ha.data(), a, bytes, cudaMemcpyDeviceToHost);
  if (err == cudaSuccess) err = cudaMemcpy(hb.data(), b, bytes, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    *ok_cuda = false;
    return false;
  }
  if (std::memcmp(ha.data(), hb.data(), bytes) == 0) return true;
  size_t i = 0;
  while (ha[i] == hb[i]) ++i;
  const size_t element = i / element_size;
  unsigned long long va = 0, vb = 0;
  std::memcpy(&va, ha.data() + element * element_size, element_size);
  std::memcpy(&vb, hb.data() + element * element_size, element_size);
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s%s: first difference at element %zu (fused 0x%llx, composed 0x%llx)",
                note->empty() ? "" : "; ", name, element, va, vb);
  *note += buf;
  return false;
}

}  // namespace fusedstep::bench
