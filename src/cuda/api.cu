// The CUDA backend's entry points: what the kernels support, then for each call: validate, plan (plan.h), declare
// and back the workspace (workspace.h), fill the params (params.h), dispatch (dispatch.cu). Nothing else.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "common/env.h"
#include "common/head_slices.h"
#include "cuda/check.h"
#include "cuda/decode_params.h"
#include "cuda/cuda_api.h"
#include "cuda/dispatch.h"
#include "cuda/launch/decode_launch.h"  // decode_split_blocks_per_sm
#include "cuda/launch/launch.h"         // fwd128_is
#include "cuda/params.h"
#include "cuda/plan.h"
#include "cuda/value_check.h"
#include "cuda/workspace.h"
#include "cuda/workspace_tables.h"

namespace pathattn::cuda {
namespace {

Support no(std::string why) { return Support{false, std::move(why)}; }

bool aligned(const void* ptr, std::size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// The kernels read rows of D contiguous elements; K and V rows go through 16-byte cp.async, Q, O, dO and the
// gradients through 4-byte pairs.
Support check_rows(const TensorView& t, const char* name, int vec_elems) {
  if (t.strides[3] != 1)
    return no(std::string(name) + " must have a contiguous last dimension (stride 1), got stride " + std::to_string(t.strides[3]));
  const std::size_t es = dtype_size(t.dtype);
  for (int d = 0; d < 3; ++d)
    if (t.sizes[d] > 1 && t.strides[d] % vec_elems != 0)
      return no(std::string(name) + "'s stride of dimension " + std::to_string(d) + " (" + std::to_string(t.strides[d]) +
                ") must be a multiple of " + std::to_string(vec_elems) + " elements");
  if (!aligned(t.data, vec_elems * es))
    return no(std::string(name) + "'s data pointer must be aligned to " + std::to_string(vec_elems * es) + " bytes");
  return {};
}

Strides strides_of(const TensorView& t) { return Strides{t.strides[0], t.strides[1], t.strides[2]}; }

// The kernels count workspace rows and grid blocks in 32 bits (TMA coordinates are int32).
void check_32bit(const Problem& p, int NC, const char* what) {
  if (static_cast<int64_t>(NC) * p.H * kChunk > INT32_MAX || static_cast<int64_t>(NC) * p.HQ * kChunk > INT32_MAX)
    throw Error(std::string("pathattn: cuda ") + what + ": " + std::to_string(NC) + " chunks x " +
                std::to_string(std::max(p.H, p.HQ)) + " heads x " + std::to_string(kChunk) +
                " rows exceed the kernels' 32-bit coordinates (2^31 - 1); split the batch into smaller calls");
}

// The scratch limit of a call (pathattn.h, Inputs::cuda_workspace_limit), or PATHATTN_CUDA_WORKSPACE_MB's.
std::size_t workspace_limit(const Inputs& in) {
  // MiB, 0 for no limit; the bound keeps the shift below in range.
  const int64_t mb = env::integer("PATHATTN_CUDA_WORKSPACE_MB", -1, 0, int64_t{1} << 40);
  return mb < 0 ? in.cuda_workspace_limit : static_cast<std::size_t>(mb) << 20;
}

// PATHATTN_CUDA_PROFILE (dispatch.cu's stage timer) also prints how a call was cut to fit the scratch limit.
void profile_slices(const char* op, int64_t H, int64_t per_slice,
                    const std::function<std::size_t(int64_t)>& bytes_of, std::size_t limit) {
  if (!env::flag("PATHATTN_CUDA_PROFILE", false)) return;
  const std::size_t bytes = bytes_of(per_slice);
  std::fprintf(stderr,
               "[pathattn profile] workspace %s: %lld call(s) of %lld kv head(s), %.1f MiB each (limit %.0f MiB)\n", op,
               static_cast<long long>((H + per_slice - 1) / per_slice), static_cast<long long>(per_slice),
               static_cast<double>(bytes) / (1 << 20), static_cast<double>(limit) / (1 << 20));
}

// The op's input pointers and strides, in FwdParams (forward, backward) and DecodeParams alike.
template <typename Params>
void fill_inputs(Params& prm, const Problem& p, const Inputs& in) {
  prm.q = in.q.data;
  prm.k = in.k.data;
  prm.v = in.v.data;
  prm.w = in.w.data;
  prm.w_is_bf16 = in.w.dtype == DType::bf16;
  prm.beta = static_cast<const float*>(in.beta.data);
  prm.g = p.has_gate ? static_cast<const float*>(in.g.data) : nullptr;
  prm.sq = strides_of(in.q);
  prm.sk = strides_of(in.k);
  prm.sv = strides_of(in.v);
  prm.sw = strides_of(in.w);
  prm.sbeta = strides_of(in.beta);
  if (p.has_gate) prm.sg = strides_of(in.g);
}

// Uploads the tables and fills the FwdParams common to forward and backward.
void fill_shared(FwdParams& prm, const Workspace& ws, const SharedBuffers& b, const Problem& p, const Inputs& in,
                 const Plan& plan, const TensorView& o, const TensorView& lse, cudaStream_t stream) {
  ws.upload(b.chunks, plan.chunks.data(), plan.chunks.size() * sizeof(ChunkInfo), stream);
  ws.upload(b.seqs, plan.seqs.data(), plan.seqs.size() * sizeof(SeqInfo), stream);
  ws.upload(b.order, plan.fwd_order.data(), plan.fwd_order.size() * sizeof(int), stream);
  fill_inputs(prm, p, in);
  prm.o = o.data;
  prm.so = strides_of(o);
  prm.lse = static_cast<float*>(lse.data);
  prm.slse = strides_of(lse);
  prm.B = static_cast<int>(p.B);
  prm.T = static_cast<int>(p.T);
  prm.H = static_cast<int>(p.H);
  prm.HQ = static_cast<int>(p.HQ);
  prm.group = static_cast<int>(p.group);
  prm.num_chunks = static_cast<int>(plan.chunks.size());
  prm.num_seqs = static_cast<int>(plan.seqs.size());
  prm.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  prm.chunks = ws.ptr<const ChunkInfo>(b.chunks);
  prm.seqs = ws.ptr<const SeqInfo>(b.seqs);
  prm.order = ws.ptr<const int>(b.order);
  prm.ws.khat = ws.ptr<void>(b.khat);
  prm.ws.u = ws.ptr<void>(b.u);
  prm.ws.w = ws.ptr<void>(b.w);
  prm.ws.m = b.m >= 0 ? ws.ptr<void>(b.m) : nullptr;
  prm.ws.step = ws.ptr<void>(b.step);
  if (b.f32 >= 0) {
    const std::size_t rows = plan.chunks.size() * p.H * kChunk;
    prm.ws.khat32 = ws.ptr<float>(b.f32);
    prm.ws.u32 = prm.ws.khat32 + rows * p.D;
    prm.ws.w32 = prm.ws.u32 + rows * p.D;
  }
  if (p.has_gate) {
    prm.ws.gl = ws.ptr<float>(b.gl);
    prm.ws.goff = ws.ptr<double>(b.goff);
    prm.ws.gtot = ws.ptr<double>(b.gtot);
  }
}

}  // namespace

Support supports(const Problem& p, const Inputs& in, bool /*backward: same support as the forward*/) {
  if (p.device != Device::cuda) return no("the cuda backend runs on CUDA tensors only");
  if (!cuda_head_dim_supported(p.D))
    return no("the CUDA kernels support head dimension D = 64 or 128, got D = " + std::to_string(p.D));
  if (p.DV != p.D)
    return no("the CUDA kernels need DV == D, got D = " + std::to_string(p.D) + ", DV = " + std::to_string(p.DV));
  if (p.T > (int64_t(1) << 30) || p.B * p.T > (int64_t(1) << 30))
    return no("B * T = " + std::to_string(p.B * p.T) + " exceeds the CUDA kernels' limit of 2^30 rows");
  for (auto [t, name, vec] : {std::tuple{&in.q, "q", 2}, {&in.k, "k", 8}, {&in.v, "v", 8}})
    if (Support s = check_rows(*t, name, vec); !s) return s;
  if (in.w.strides[3] != 1)
    return no("w must have a contiguous last dimension (stride 1), got stride " + std::to_string(in.w.strides[3]));
  return {};
}

namespace {

// The two-level carry's tables (blk_of, then blk_start: one upload) and FwdParams' block fields, forward and backward
// alike (plan.carry_block > 0).
void fill_blocks(FwdParams& prm, Workspace& ws, int tables_id, const Plan& plan, cudaStream_t stream) {
  std::vector<int> tables(plan.blk_of);
  tables.insert(tables.end(), plan.blk_start.begin(), plan.blk_start.end());
  ws.upload(tables_id, tables.data(), tables.size() * sizeof(int), stream);
  prm.carry_block = plan.carry_block;
  prm.num_blocks = static_cast<int>(plan.blk_start.size());
  prm.blk_of = ws.ptr<const int>(tables_id);
  prm.blk_start = prm.blk_of + plan.blk_of.size();
}

// The two-level forward's block size setting (docs/math.md Eq. 51-53; FwdParams::carry_block): env PATHATTN_FWD_BLOCK,
// 0 (off), B >= 1, or -1: by count for the call's longest sequence (fwd_block_by_count); unset, plan.cu's
// fwd_block_default (measured). B = 1 takes the far path for every earlier chunk (K' = K^, F = E: the per-chunk
// products, through the far path's code).
constexpr int kFwdBlockUnset = -2;
int fwd_block_setting() {
  static const int block = static_cast<int>(env::integer("PATHATTN_FWD_BLOCK", kFwdBlockUnset, -1, 1 << 20));
  return block;
}

// The forward's plan, with its block tables when the two-level forward is on. The default leaves blocks off for the
// D = 128 mma.sync forward (PATHATTN_FWD128=mma), which has no two-level form.
Plan forward_plan(const std::vector<Segment>& segs, int64_t H, int64_t group, int64_t D) {
  Plan plan = make_plan(segs, static_cast<int>(H), false);
  const int setting = fwd_block_setting(), chunks = plan.max_chunks, g = static_cast<int>(group), d = static_cast<int>(D);
  const int block = setting >= 0    ? setting
                    : setting == -1 ? fwd_block_by_count(chunks, g, d)
                    : (D == 128 && fwd128_is("mma")) ? 0
                                                     : fwd_block_default(chunks, g, d);
  add_carry_blocks(plan, block);
  return plan;
}

// One forward call over all of p's heads (a slice of the caller's, see forward()).
void forward_heads(const Problem& p, const Inputs& in, const ForwardOutputs& out, const std::vector<Segment>& segs,
                   cudaStream_t stream) {
  const bool want_kcache = out.kcache.defined();
  const Plan plan = forward_plan(segs, p.H, p.group, p.D);
  const int NC = static_cast<int>(plan.chunks.size());
  if (NC == 0) return;
  check_32bit(p, NC, "forward");

  Workspace ws;
  const SharedBuffers shared = declare_shared(ws, p, plan, want_kcache, true);
  const FwdBlockBuffers blocks = declare_fwd_blocks(ws, p, plan);
  ws.acquire(in, in.q.device_index, stream);
  FwdParams prm{};
  fill_shared(prm, ws, shared, p, in, plan, out.o, out.lse, stream);
  prm.kcache = want_kcache ? out.kcache.data : nullptr;
  if (want_kcache) prm.skc = strides_of(out.kcache);
  if (plan.carry_block > 0) {
    fill_blocks(prm, ws, blocks.tables, plan, stream);
    prm.kfar = ws.ptr<void>(blocks.kfar);
    prm.blockstep = ws.ptr<void>(blocks.blockstep);
  }
  run_forward(prm, p.dtype, static_cast<int>(p.D), p.has_gate, want_kcache, stream);
}

}  // namespace

void forward(const Problem& p, const Inputs& in, const ForwardOutputs& out) {
  if (Support s = supports(p, in, false); !s) throw Error("pathattn: cuda forward: " + s.reason);
  if (Support s = check_rows(out.o, "o", 2); !s) throw Error("pathattn: cuda forward: " + s.reason);
  const bool want_kcache = out.kcache.defined();
  if (want_kcache && out.kcache.strides[3] != 1) throw Error("pathattn: kcache (output) must have a contiguous last dimension");
  if (p.B == 0 || p.T == 0) return;
  if (fwd_block_setting() != 0 && fwd_block_setting() != kFwdBlockUnset && p.D == 128 && fwd128_is("mma"))
    throw Error("pathattn: cuda forward: PATHATTN_FWD_BLOCK (the two-level forward) needs the wgmma forward kernel; "
                "PATHATTN_FWD128=mma has no two-level form: unset one of them");
  DeviceGuard guard(in.q.device_index);
  const cudaStream_t stream = static_cast<cudaStream_t>(in.cuda_stream);
  if (checks_values(in)) check_values(in, p, stream);
  const std::vector<Segment> segs = sequences(p, in, stream);
  // Within the scratch limit: groups of kv heads in turn (common/head_slices.h), each its own call.
  const auto bytes = [&](int64_t n) {
    Workspace ws;
    const Problem sp = slice_problem(p, {0, n});
    const Plan plan = forward_plan(segs, n, p.group, p.D);
    declare_shared(ws, sp, plan, want_kcache, true);
    declare_fwd_blocks(ws, sp, plan);
    return ws.total();
  };
  const std::size_t limit = workspace_limit(in);
  const int64_t per_slice = heads_per_slice(p.H, limit, bytes);
  profile_slices("forward", p.H, per_slice, bytes, limit);
  for (const HeadSlice& s : head_slices(p.H, per_slice))
    forward_heads(slice_problem(p, s), slice_inputs(in, s, p.group), slice_outputs(out, s, p.group), segs, stream);
}

namespace {

// One backward call over all of p's heads (a slice of the caller's, see backward()).
void backward_heads(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse,
                    const TensorView& dout, const TensorView& dlse, const Gradients& grads,
                    const std::vector<Segment>& segs, int pair_group, const BwdGrid& resident, cudaStream_t stream) {
  const int D = static_cast<int>(p.D);
  const Plan plan =
      backward_plan(segs, static_cast<int>(p.H), pair_group, main_key_block(resident), D, in.deterministic);
  const int NC = static_cast<int>(plan.chunks.size());
  if (NC == 0) return;
  check_32bit(p, NC, "backward");
  const BwdGrid grid = backward_grid_for(resident, p, plan);
  const int slot_chunks = bwd_slot_chunks(plan);
  if (static_cast<int64_t>(main_slots(grid)) * slot_chunks * kChunk > INT32_MAX)
    throw Error("pathattn: cuda backward: " + std::to_string(main_slots(grid)) + " slots x " +
                std::to_string(slot_chunks * kChunk) + " rows exceed the kernels' 32-bit coordinates (2^31 - 1)");

  Workspace ws;
  const BwdBuffers b = declare_backward(ws, p, plan, grid);
  ws.acquire(in, in.q.device_index, stream);

  BwdParams prm{};
  fill_shared(prm, ws, b.shared, p, in, plan, o, lse, stream);
  ws.upload(b.tasks, plan.bwd_tasks.data(), plan.bwd_tasks.size() * sizeof(int), stream);
  for (int zeroed : {b.dqacc, b.dpacc, b.count_q, b.count_p, b.next_task}) ws.zero(zeroed, stream);
  if (p.has_gate) ws.zero(b.dgrow, stream);
  if (plan.carry_block > 0) for (int zeroed : {b.dqfar, b.dpiacc, b.count_pi}) ws.zero(zeroed, stream);
  prm.dout = dout.data;
  prm.sdo = strides_of(dout);
  prm.dlse = dlse.defined() ? static_cast<const float*>(dlse.data) : nullptr;
  if (dlse.defined()) prm.sdlse = strides_of(dlse);
  prm.dq = grads.dq.data;
  prm.dk = grads.dk.data;
  prm.dv = grads.dv.data;
  prm.dw = grads.dw.data;
  prm.dbeta = static_cast<float*>(grads.dbeta.data);
  prm.dg = p.has_gate ? static_cast<float*>(grads.dg.data) : nullptr;
  prm.sdq = strides_of(grads.dq);
  prm.sdk = strides_of(grads.dk);
  prm.sdv = strides_of(grads.dv);
  prm.sdw = strides_of(grads.dw);
  prm.sdbeta = strides_of(grads.dbeta);
  if (p.has_gate) prm.sdg = strides_of(grads.dg);
  prm.scale = static_cast<float>(p.scale);
  prm.qhat = ws.ptr<void>(b.qhat);
  prm.lse2 = ws.ptr<float>(b.lse2);
  prm.delta = ws.ptr<float>(b.delta);
  prm.dohat = b.dohat >= 0 ? ws.ptr<void>(b.dohat) : nullptr;
  prm.dqacc = ws.ptr<float>(b.dqacc);
  prm.dkacc = ws.ptr<float>(b.dkacc);
  prm.dvacc = ws.ptr<float>(b.dvacc);
  prm.dpacc = ws.ptr<float>(b.dpacc);
  prm.dgacc = b.dgacc >= 0 ? ws.ptr<float>(b.dgacc) : nullptr;
  prm.dgrow = b.dgrow >= 0 ? ws.ptr<float>(b.dgrow) : nullptr;
  prm.count_q = ws.ptr<int>(b.count_q);
  prm.count_p = ws.ptr<int>(b.count_p);
  prm.next_task = ws.ptr<int>(b.next_task);
  prm.tasks = ws.ptr<const int>(b.tasks);
  prm.num_tasks = static_cast<int>(plan.bwd_tasks.size());
  prm.slots = ws.ptr<void>(b.slots);
  prm.slot_chunks = slot_chunks;
  prm.local_scratch = ws.ptr<float>(b.local);
  if (plan.carry_block > 0) {
    fill_blocks(prm, ws, b.blk_tables, plan, stream);
    prm.blockstep = ws.ptr<void>(b.blockstep);
    prm.sprefix = ws.ptr<void>(b.sprefix);
    prm.qfar = ws.ptr<void>(b.qfar);
    prm.dqfar = ws.ptr<float>(b.dqfar);
    prm.dpiacc = ws.ptr<float>(b.dpiacc);
    prm.count_pi = ws.ptr<int>(b.count_pi);
  }
  prm.deterministic = in.deterministic;
  static const bool acq_rel = env::choice("PATHATTN_BWD_FENCE", {"sc", "acq_rel"}, "sc") == "acq_rel";
  prm.turn_fence_acq_rel = acq_rel;
  static const int held = static_cast<int>(env::integer("PATHATTN_BWD_HELD", 2, 2, 4));  // params.h
  prm.held_passes = held;
  prm.local_qdo_async = check_rows(in.q, "q", 8) && check_rows(dout, "dout", 8);  // 16-byte rows (params.h)
  prm.timing_skip = static_cast<int>(env::integer("PATHATTN_BWD_TIMING_SKIP", 0, 0, 2047));  // params.h's bits
  run_backward(prm, grid, p.dtype, D, p.has_gate, stream);
}

}  // namespace

void backward(const Problem& p, const Inputs& in, const TensorView& o, const TensorView& lse, const TensorView& dout,
              const TensorView& dlse, const Gradients& grads) {
  if (Support s = supports(p, in, true); !s) throw Error("pathattn: cuda backward: " + s.reason);
  for (auto [t, name] : {std::pair{&o, "o"}, {&dout, "dout"}, {&grads.dq, "dq"}, {&grads.dk, "dk"}, {&grads.dv, "dv"}})
    if (Support s = check_rows(*t, name, 2); !s) throw Error("pathattn: cuda backward: " + s.reason);
  if (p.B == 0 || p.T == 0) return;
  DeviceGuard guard(in.q.device_index);
  const cudaStream_t stream = static_cast<cudaStream_t>(in.cuda_stream);
  if (checks_values(in)) check_values(in, p, stream);
  // Pairs interleaved in the main kernel's task list (plan.cu); PATHATTN_BWD_PAIR_GROUP overrides it for timing.
  const std::vector<Segment> segs = sequences(p, in, stream);
  int64_t longest = 0;
  for (const Segment& s : segs) longest = std::max(longest, s.len);
  const int pair_group = static_cast<int>(
      env::integer("PATHATTN_BWD_PAIR_GROUP", bwd_pair_group(longest), 1, std::numeric_limits<int>::max()));
  const BwdGrid resident =
      backward_grid(p.dtype, static_cast<int>(p.D), p.has_gate, in.deterministic, static_cast<int>(p.group));
  // Within the scratch limit: groups of kv heads in turn (common/head_slices.h), each its own call. The sums
  // across heads are GQA's over the query heads of one kv head, which stay in one slice: the same bits either way.
  const auto bytes = [&](int64_t n) {
    const Problem ps = slice_problem(p, {0, n});
    const Plan plan = backward_plan(segs, static_cast<int>(n), pair_group, main_key_block(resident),
                                    static_cast<int>(p.D), in.deterministic);
    Workspace ws;
    declare_backward(ws, ps, plan, backward_grid_for(resident, ps, plan));
    return ws.total();
  };
  const std::size_t limit = workspace_limit(in);
  const int64_t per_slice = heads_per_slice(p.H, limit, bytes);
  profile_slices("backward", p.H, per_slice, bytes, limit);
  for (const HeadSlice& s : head_slices(p.H, per_slice)) {
    const HeadSlice qs = query_heads(s, p.group);
    backward_heads(slice_problem(p, s), slice_inputs(in, s, p.group), slice_heads(o, qs), slice_heads(lse, qs),
                   slice_heads(dout, qs), slice_heads(dlse, qs), slice_gradients(grads, s, p.group), segs, pair_group,
                   resident, stream);
  }
}

Support supports_decode(const Problem& p, const Inputs& in) {
  // The decode kernels read the new tokens' rows as the forward does (and have the same D / DV instances).
  return supports(p, in, false);
}

void decode(const Problem& p, const Inputs& in, const DecodeCache& cache, const ForwardOutputs& out, bool commit) {
  if (Support s = supports_decode(p, in); !s) throw Error("pathattn: cuda decode: " + s.reason);
  if (!commit && p.T > kChunk)  // the chunked kernels' one pass reads the cache as it is: one chunk
    throw Error("pathattn: cuda decode with commit = false takes at most " + std::to_string(kChunk) +
                " new tokens (one pass over the cache), got S = " + std::to_string(p.T));
  if (Support s = check_rows(out.o, "o", 2); !s) throw Error("pathattn: cuda decode: " + s.reason);
  // Cache rows go through 4-element loads and stores (float4, or 8 bytes for a bf16 / f16 cache).
  for (auto [t, name] : {std::pair{&cache.k, "cache.k"}, {&cache.v, "cache.v"}})
    if (Support s = check_rows(*t, name, 4); !s) throw Error("pathattn: cuda decode: " + s.reason);
  const int64_t Tmax = cache.k.sizes[1];
  if (Tmax >= INT32_MAX)
    throw Error("pathattn: cuda decode: the cache's Tmax = " + std::to_string(Tmax) + " exceeds the kernels' 32-bit rows");
  if (p.B == 0 || p.T == 0) return;
  // The lengths are on the device (not read here): only what the sizes alone rule out is an Error; a sequence whose
  // lengths[b] + S exceeds Tmax gets NaN o and lse from the kernels and is left as it was.
  if (p.T > Tmax)
    throw Error("pathattn: cuda decode: the " + std::to_string(p.T) + " new tokens do not fit the cache's Tmax = " +
                std::to_string(Tmax));
  DeviceGuard guard(in.q.device_index);
  const cudaStream_t stream = static_cast<cudaStream_t>(in.cuda_stream);
  if (checks_values(in)) check_values(in, p, stream);
  DecodeParams prm{};
  fill_inputs(prm, p, in);
  prm.ck = cache.k.data;
  prm.ck_bf16 = cache.k.dtype == DType::bf16;
  prm.cv = cache.v.data;
  prm.cv_low = cache.v.dtype != DType::f32;  // v's dtype (pathattn::decode checked it)
  prm.sck = strides_of(cache.k);
  prm.scv = strides_of(cache.v);
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, in.q.device_index));
  const bool checkpointed = cache.ckpt.defined();
  // A call of several tokens in chunks (launch/decode_chunk.cu; prm.chunk_rows > 0 tells the launcher), and every
  // call without commit: at most kDecodeChunkMaxSplits splits, since each split adds a partial per token of the
  // chunk (not tuned).
  const bool chunked = !commit || decode_uses_chunks(checkpointed, p.T);
  const int ns_plan = decode_splits(p.B, p.H, Tmax, sms,
                                    decode_split_blocks_per_sm(prm, p.dtype == DType::bf16, static_cast<int>(p.D)));
  const int ns = chunked ? std::min(ns_plan, kDecodeChunkMaxSplits) : ns_plan;
  if (p.B * p.H * ns > INT32_MAX || p.B * p.HQ > INT32_MAX)
    throw Error("pathattn: cuda decode: B * H = " + std::to_string(p.B * p.H) + " exceeds the kernels' grid");

  if (checkpointed) {  // the carry kernel reads M as a contiguous [D][D] block per (sequence, kv head)
    const TensorView& m = cache.carry;
    if (m.strides[3] != 1 || m.strides[2] != p.D || m.strides[1] != p.D * p.D || m.strides[0] != p.H * p.D * p.D)
      throw Error("pathattn: cuda decode: cache.carry must be contiguous [B, H, D, D]");
    if (!aligned(m.data, 16)) throw Error("pathattn: cuda decode: cache.carry's data pointer must be aligned to 16 bytes");
  }

  // Chunks: partials for min(S, 64) tokens and one more slot (the chunk's own attention), the chunk's factors and
  // its carried-back queries.
  const int64_t chunk_rows = chunked ? std::min<int64_t>(p.T, kChunk) : 0;
  Workspace ws;
  const std::size_t parts = chunked ? static_cast<std::size_t>(p.B) * p.HQ * chunk_rows * (ns + 1)
                                    : static_cast<std::size_t>(p.B) * p.HQ * ns;
  const int part_o = ws.add("decode partial o", parts * p.D * 4);
  const int part_ml = ws.add("decode partial max, sum", parts * 2 * 4);
  const std::size_t chunk_kv = static_cast<std::size_t>(p.B) * p.H * kChunk * p.D * 4;
  const int chunk_u = chunked ? ws.add("decode chunk U", chunk_kv) : -1;
  const int chunk_w = chunked ? ws.add("decode chunk W", chunk_kv) : -1;
  const int chunk_q = chunked ? ws.add("decode chunk carried-back queries", chunk_kv / p.H * p.HQ) : -1;
  const int chunk_g =
      chunked && p.has_gate ? ws.add("decode chunk G", static_cast<std::size_t>(p.B) * p.HQ * kChunk * 8) : -1;
  const int snap = ws.add("decode lengths seen", static_cast<std::size_t>(p.B) * 4);
  const int ck_snap = checkpointed ? ws.add("decode checkpoints seen", static_cast<std::size_t>(p.B) * 4) : -1;
  const int qcar = checkpointed ? ws.add("decode carried-back queries", static_cast<std::size_t>(p.B) * p.HQ * p.D * 4) : -1;
  ws.acquire(in, in.q.device_index, stream);

  if (p.has_gate) {
    prm.cg = cache.gcum.data;
    prm.cg_f64 = cache.gcum.dtype == DType::f64;
    prm.scg = strides_of(cache.gcum);
  }
  prm.lengths = static_cast<int32_t*>(cache.lengths.data);
  prm.slen = cache.lengths.strides[0];
  prm.Tmax = static_cast<int>(Tmax);
  prm.o = out.o.data;
  prm.so = strides_of(out.o);
  prm.lse = static_cast<float*>(out.lse.data);
  prm.slse = strides_of(out.lse);
  prm.B = static_cast<int>(p.B);
  prm.H = static_cast<int>(p.H);
  prm.HQ = static_cast<int>(p.HQ);
  prm.group = static_cast<int>(p.group);
  prm.num_splits = ns;
  prm.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  prm.part_o = ws.ptr<float>(part_o);
  prm.part_ml = ws.ptr<float>(part_ml);
  prm.len_snap = ws.ptr<int32_t>(snap);
  prm.commit = commit;
  if (chunked) {
    prm.chunk_rows = static_cast<int>(chunk_rows);
    prm.chunk_u = ws.ptr<float>(chunk_u);
    prm.chunk_w = ws.ptr<float>(chunk_w);
    prm.chunk_q = ws.ptr<float>(chunk_q);
    if (chunk_g >= 0) prm.chunk_g = ws.ptr<double>(chunk_g);
  }
  if (checkpointed) {
    prm.ckpt = static_cast<int32_t*>(cache.ckpt.data);
    prm.sckpt = cache.ckpt.strides[0];
    prm.carry = static_cast<float*>(cache.carry.data);
    prm.period = static_cast<int>(std::min<int64_t>(cache.ckpt_period, INT32_MAX));
    prm.ckpt_snap = ws.ptr<int32_t>(ck_snap);
    prm.qcarried = ws.ptr<float>(qcar);
  }
  run_decode(prm, p.dtype, static_cast<int>(p.D), static_cast<int>(p.T), stream);
}

}  // namespace pathattn::cuda
