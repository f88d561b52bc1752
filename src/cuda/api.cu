// The CUDA backend's entry points: what the kernels support, the chunk tables, the workspace, the launch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/check.h"
#include "cuda/cuda_api.h"
#include "cuda/dispatch.h"
#include "cuda/params.h"

namespace pathattn::cuda {
namespace {

Support no(std::string why) { return Support{false, std::move(why)}; }

bool aligned(const void* ptr, std::size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// The kernels read rows of D contiguous elements; K and V rows go through 16-byte cp.async, Q and O through
// 4-byte pairs.
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

// A grow-only device buffer per device, reused across calls. Calls may come on different streams: each call's
// stream first waits for the event recorded after the previous call's kernels (`done`), so a later call's table
// upload never overwrites tables an earlier call's kernels on another stream still read.
struct Scratch {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t done = nullptr;
};
std::mutex g_scratch_mutex;
Scratch g_scratch[64];

void* scratch(int device, std::size_t bytes) {
  Scratch& s = g_scratch[device];
  if (s.bytes < bytes) {
    if (s.ptr) CUDA_CHECK(cudaFree(s.ptr));
    s.ptr = nullptr;
    s.bytes = 0;
    CUDA_CHECK(cudaMalloc(&s.ptr, bytes));
    s.bytes = bytes;
  }
  return s.ptr;
}

// Restores the caller's current device on scope exit.
struct DeviceGuard {
  int prev = 0;
  explicit DeviceGuard(int device) {
    CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device) CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(prev); }
};

// Sequences as (b, t0, len): from the problem, or from cu_seqlens read back from the device.
std::vector<Segment> sequences(const Problem& p, const Inputs& in, cudaStream_t stream) {
  if (!p.varlen) {
    std::vector<Segment> s;
    for (int64_t b = 0; b < p.B; ++b) s.push_back({b, 0, p.T});
    return s;
  }
  const TensorView& cu = in.cu_seqlens;
  const int64_t n = cu.sizes[0] - 1;
  std::vector<int32_t> h(static_cast<std::size_t>((n * cu.strides[0]) + 1));
  // On the caller's stream, after whatever produced cu_seqlens there.
  CUDA_CHECK(cudaMemcpyAsync(h.data(), cu.data, h.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  auto at = [&](int64_t i) { return static_cast<int64_t>(h[i * cu.strides[0]]); };
  if (at(0) != 0) throw Error("pathattn: cu_seqlens[0] must be 0, got " + std::to_string(at(0)));
  std::vector<Segment> s;
  for (int64_t i = 0; i < n; ++i) {
    if (at(i + 1) < at(i))
      throw Error("pathattn: cu_seqlens must be non-decreasing, got cu_seqlens[" + std::to_string(i + 1) + "] = " +
                  std::to_string(at(i + 1)) + " < cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(at(i)));
    if (at(i + 1) > at(i)) s.push_back({0, at(i), at(i + 1) - at(i)});
  }
  if (at(n) != p.T)
    throw Error("pathattn: cu_seqlens[-1] must equal the packed length T = " + std::to_string(p.T) + ", got " +
                std::to_string(at(n)));
  return s;
}

std::size_t align_up(std::size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

Support supports(const Problem& p, const Inputs& in, bool backward) {
  if (backward) return no("CUDA backward kernels are not implemented yet");
  if (p.device != Device::cuda) return no("the cuda backend runs on CUDA tensors only");
  if (p.D != 64 && p.D != 128)
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

void forward(const Problem& p, const Inputs& in, const ForwardOutputs& out) {
  if (Support s = supports(p, in, false); !s) throw Error("pathattn: cuda forward: " + s.reason);
  if (Support s = check_rows(out.o, "o", 2); !s) throw Error("pathattn: cuda forward: " + s.reason);
  const bool want_kcache = out.kcache.defined();
  if (want_kcache && out.kcache.strides[3] != 1) throw Error("pathattn: kcache (output) must have a contiguous last dimension");
  if (p.B == 0 || p.T == 0) return;
  DeviceGuard guard(in.q.device_index);

  // Chunk and sequence tables; chunks restart at each sequence start.
  const cudaStream_t stream = static_cast<cudaStream_t>(in.cuda_stream);
  const std::vector<Segment> segs = sequences(p, in, stream);
  std::vector<ChunkInfo> chunks;
  std::vector<SeqInfo> seqs;
  for (const Segment& s : segs) {
    SeqInfo si{static_cast<int>(chunks.size()), 0};
    for (int64_t c0 = 0; c0 < s.len; c0 += kChunk) {
      chunks.push_back({static_cast<int>(s.b), static_cast<int>(s.t0 + c0), static_cast<int>(std::min<int64_t>(kChunk, s.len - c0)), si.first});
      ++si.count;
    }
    seqs.push_back(si);
  }
  const int NC = static_cast<int>(chunks.size());
  if (NC == 0) return;
  // The D = 64 kernel reads the workspace as one [NC * H * C, 64] matrix through TMA, whose coordinates are int32;
  // the blocks of the grid are counted in 32 bits too.
  if (static_cast<int64_t>(NC) * p.H * kChunk > INT32_MAX || static_cast<int64_t>(NC) * p.HQ > INT32_MAX)
    throw Error("pathattn: cuda forward: " + std::to_string(NC) + " chunks x H = " + std::to_string(p.H) +
                " heads x " + std::to_string(kChunk) + " rows exceed the kernels' 32-bit coordinates (2^31 - 1); "
                "split the batch into smaller calls");
  // The main kernel's schedule (launch/fwd.cu): sequences longest first, and inside a sequence its query chunks
  // from the last (most key chunks to visit) to the first, so that the CTAs running at one time share their key
  // chunks in L2 and the grid ends on short work. The first schedule (all longest chunks of every sequence and head
  // first) made every resident CTA read different keys: L2 hit rate 5%, DRAM-bound at 3.8 TB/s (ncu, notes.md).
  std::vector<int> seq_order(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) seq_order[i] = static_cast<int>(i);
  std::stable_sort(seq_order.begin(), seq_order.end(), [&](int a, int b) { return seqs[a].count > seqs[b].count; });
  std::vector<int> order;
  order.reserve(NC);
  for (int si : seq_order)
    for (int c = seqs[si].first + seqs[si].count - 1; c >= seqs[si].first; --c) order.push_back(c);

  // Workspace layout.
  const std::size_t rows = static_cast<std::size_t>(NC) * p.H * kChunk;
  std::size_t off = 0;
  auto take = [&](std::size_t bytes) { std::size_t at = off; off += align_up(bytes); return at; };
  const std::size_t o_chunks = take(chunks.size() * sizeof(ChunkInfo));
  const std::size_t o_seqs = take(seqs.size() * sizeof(SeqInfo));
  const std::size_t o_order = take(order.size() * sizeof(int));
  const std::size_t o_khat = take(rows * p.D * 2), o_u = take(rows * p.D * 2), o_w = take(rows * p.D * 2);
  const std::size_t o_m = take(rows * kChunk * 2);
  const std::size_t o_step = take(static_cast<std::size_t>(NC) * p.H * p.D * p.D * 2);
  std::size_t o_f32 = 0, o_gl = 0, o_goff = 0, o_gtot = 0;
  if (want_kcache) o_f32 = take(3 * rows * p.D * 4);
  if (p.has_gate) {
    o_gl = take(static_cast<std::size_t>(NC) * p.HQ * kChunk * 4);
    o_goff = take(static_cast<std::size_t>(NC) * p.HQ * 8);
    o_gtot = take(static_cast<std::size_t>(NC) * p.HQ * 8);
  }

  std::lock_guard<std::mutex> lock(g_scratch_mutex);
  char* ws = static_cast<char*>(scratch(in.q.device_index, off));
  Scratch& sc = g_scratch[in.q.device_index];
  if (sc.done == nullptr) CUDA_CHECK(cudaEventCreateWithFlags(&sc.done, cudaEventDisableTiming));
  CUDA_CHECK(cudaStreamWaitEvent(stream, sc.done, 0));  // the previous call's kernels, on any stream
  // Copies from pageable memory on the stream: each returns once its source is staged (the host vectors may go),
  // and lands after the stream's earlier work.
  CUDA_CHECK(cudaMemcpyAsync(ws + o_chunks, chunks.data(), chunks.size() * sizeof(ChunkInfo), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(ws + o_seqs, seqs.data(), seqs.size() * sizeof(SeqInfo), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(ws + o_order, order.data(), order.size() * sizeof(int), cudaMemcpyHostToDevice, stream));

  Params prm{};
  prm.q = in.q.data;
  prm.k = in.k.data;
  prm.v = in.v.data;
  prm.w = in.w.data;
  prm.w_is_bf16 = in.w.dtype == DType::bf16;
  prm.beta = static_cast<const float*>(in.beta.data);
  prm.g = p.has_gate ? static_cast<const float*>(in.g.data) : nullptr;
  auto s4 = [](const TensorView& t) { return Strides4{t.strides[0], t.strides[1], t.strides[2]}; };
  auto s3 = [](const TensorView& t) { return Strides3{t.strides[0], t.strides[1], t.strides[2]}; };
  prm.sq = s4(in.q);
  prm.sk = s4(in.k);
  prm.sv = s4(in.v);
  prm.sw = s4(in.w);
  prm.so = s4(out.o);
  prm.sbeta = s3(in.beta);
  if (p.has_gate) prm.sg = s3(in.g);
  prm.slse = s3(out.lse);
  prm.o = out.o.data;
  prm.lse = static_cast<float*>(out.lse.data);
  prm.kcache = want_kcache ? out.kcache.data : nullptr;
  if (want_kcache) prm.skc = s4(out.kcache);
  prm.B = static_cast<int>(p.B);
  prm.T = static_cast<int>(p.T);
  prm.H = static_cast<int>(p.H);
  prm.HQ = static_cast<int>(p.HQ);
  prm.group = static_cast<int>(p.group);
  prm.num_chunks = NC;
  prm.num_seqs = static_cast<int>(seqs.size());
  prm.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  prm.chunks = reinterpret_cast<const ChunkInfo*>(ws + o_chunks);
  prm.seqs = reinterpret_cast<const SeqInfo*>(ws + o_seqs);
  prm.order = reinterpret_cast<const int*>(ws + o_order);
  prm.ws.khat = ws + o_khat;
  prm.ws.u = ws + o_u;
  prm.ws.w = ws + o_w;
  prm.ws.m = ws + o_m;
  prm.ws.step = ws + o_step;
  if (want_kcache) {
    prm.ws.khat32 = reinterpret_cast<float*>(ws + o_f32);
    prm.ws.u32 = prm.ws.khat32 + rows * p.D;
    prm.ws.w32 = prm.ws.u32 + rows * p.D;
  }
  if (p.has_gate) {
    prm.ws.gl = reinterpret_cast<float*>(ws + o_gl);
    prm.ws.goff = reinterpret_cast<double*>(ws + o_goff);
    prm.ws.gtot = reinterpret_cast<double*>(ws + o_gtot);
  }
  run_forward(prm, p.dtype, static_cast<int>(p.D), p.has_gate, want_kcache, stream);
  CUDA_CHECK(cudaEventRecord(sc.done, stream));
}

void backward(const Problem&, const Inputs&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
              const Gradients&) {
  throw Error("pathattn: the cuda backend does not support this case: CUDA backward kernels are not implemented yet");
}

}  // namespace pathattn::cuda
