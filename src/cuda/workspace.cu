#include "cuda/workspace.h"

#include <string>

#include "cuda/check.h"

namespace pathattn::cuda {
namespace {

// A grow-only device buffer per device, reused across calls that pass no workspace allocator. Calls may come on
// different streams: each call's stream first waits for the event recorded after the previous call's kernels
// (`done`), so a later call's table upload never overwrites tables an earlier call's kernels on another stream
// still read.
struct Scratch {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t done = nullptr;
};
std::mutex g_scratch_mutex;
Scratch g_scratch[64];

}  // namespace

int Workspace::add(const char* name, std::size_t bytes) {
  entries_.push_back({name, total_, bytes});
  total_ += (bytes + 255) / 256 * 256;
  return static_cast<int>(entries_.size()) - 1;
}

int Workspace::overlay(const char* name, int first, int last, std::size_t bytes) {
  if (first < 0 || last < first || last >= static_cast<int>(entries_.size()))
    throw Error(std::string("pathattn: internal: workspace overlay of ") + name + " on entries " + std::to_string(first) +
                ".." + std::to_string(last) + " of " + std::to_string(entries_.size()));
  const Entry& a = entries_[static_cast<std::size_t>(first)];
  const Entry& z = entries_[static_cast<std::size_t>(last)];
  if (bytes > z.offset + z.bytes - a.offset) return add(name, bytes);
  entries_.push_back({name, a.offset, bytes});
  return static_cast<int>(entries_.size()) - 1;
}

bool Workspace::overlaps(int a, int b) const {
  const Entry& x = entries_[static_cast<std::size_t>(a)];
  const Entry& y = entries_[static_cast<std::size_t>(b)];
  return x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
}

void Workspace::acquire(const Inputs& in, int device, cudaStream_t stream) {
  stream_ = stream;
  if (total_ == 0) return;
  if (in.cuda_workspace) {
    base_ = static_cast<char*>(in.cuda_workspace(total_));
    if (base_ == nullptr)
      throw RuntimeError("pathattn: the workspace allocator returned null for " + std::to_string(total_) + " bytes");
    if (reinterpret_cast<uintptr_t>(base_) % 256 != 0)
      throw Error("pathattn: cuda_workspace must return 256-byte aligned memory");
    return;
  }
  if (device < 0 || device >= 64) throw Error("pathattn: CUDA device index " + std::to_string(device) + " out of range");
  lock_ = std::unique_lock<std::mutex>(g_scratch_mutex);
  device_ = device;
  Scratch& s = g_scratch[device];
  if (s.bytes < total_) {
    if (s.ptr) CUDA_CHECK(cudaFree(s.ptr));
    s.ptr = nullptr;
    s.bytes = 0;
    CUDA_CHECK(cudaMalloc(&s.ptr, total_));
    s.bytes = total_;
  }
  if (s.done == nullptr) CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  CUDA_CHECK(cudaStreamWaitEvent(stream, s.done, 0));  // the previous call's kernels, on any stream
  base_ = static_cast<char*>(s.ptr);
}

void Workspace::upload(int id, const void* host, std::size_t bytes, cudaStream_t stream) const {
  // From pageable memory on the stream: returns once the source is staged (the host vector may go), and lands
  // after the stream's earlier work.
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(ptr<char>(id), host, bytes, cudaMemcpyHostToDevice, stream));
}

void Workspace::zero(int id, cudaStream_t stream) const {
  if (entries_[static_cast<std::size_t>(id)].bytes)
    CUDA_CHECK(cudaMemsetAsync(ptr<char>(id), 0, entries_[static_cast<std::size_t>(id)].bytes, stream));
}

Workspace::~Workspace() {
  // The library's buffer: the next call (any stream) waits for everything this call queued.
  // Unchecked: a destructor may not throw (it also runs while an exception unwinds). It fails only on an error
  // that is already sticky on the device, which the next checked call reports.
  if (lock_.owns_lock()) (void)cudaEventRecord(g_scratch[device_].done, stream_);
}

}  // namespace pathattn::cuda
