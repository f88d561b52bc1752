// The call's scratch memory as a named table: every buffer a kernel family needs is declared with add(), then one
// allocation backs them all. The memory comes from the caller (Inputs::cuda_workspace: the torch layer passes
// torch's caching allocator, so the buffers are stream-ordered and show in torch's memory statistics) or, when the
// caller gives none, from one grow-only buffer per device kept by the library.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "pathattn/pathattn.h"

namespace pathattn::cuda {

class Workspace {
 public:
  // Reserves `bytes` (rounded up to 256) under `name`; returns the handle ptr() takes.
  int add(const char* name, std::size_t bytes);
  // Reserves `bytes` under `name` in the memory of the entries first..last (consecutive handles) when it fits there,
  // else as add() does. The caller guarantees that those entries are dead (no kernel of the call reads or writes
  // them any more) before this buffer is first written, and that nothing zeroes or uploads into either while the
  // other is live (workspace_tables.h says which pairs do so and why).
  int overlay(const char* name, int first, int last, std::size_t bytes);
  // Whether two entries' memory intersects (an overlay and what it reuses).
  bool overlaps(int a, int b) const;
  std::size_t total() const { return total_; }
  // Backs the table with memory (see the file comment); stream-ordered after any earlier call that used the
  // library's own buffer on another stream. Holds that buffer until the Workspace is destroyed.
  void acquire(const Inputs& in, int device, cudaStream_t stream);
  template <typename T>
  T* ptr(int id) const {
    return reinterpret_cast<T*>(base_ + entries_[static_cast<std::size_t>(id)].offset);
  }
  std::size_t bytes(int id) const { return entries_[static_cast<std::size_t>(id)].bytes; }
  // Host -> device copy into a buffer, and zero-fill, on the stream.
  void upload(int id, const void* host, std::size_t bytes, cudaStream_t stream) const;
  void zero(int id, cudaStream_t stream) const;
  ~Workspace();

 private:
  struct Entry {
    const char* name;
    std::size_t offset, bytes;
  };
  std::vector<Entry> entries_;
  std::size_t total_ = 0;
  char* base_ = nullptr;
  std::unique_lock<std::mutex> lock_;  // the library's own buffer, while this call uses it
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

}  // namespace pathattn::cuda
