// Pre-tokenised shards of the language-model data (tools/lm_data.py writes them; docs/results/lm/README.md).
//
// A shard is one file: a 32-byte little-endian header, then `count` token ids as uint16:
//   offset 0  char[8] magic "PATHLMTK"
//          8  u32     version (1)
//         12  u32     vocab (every id < vocab; at most 65536 so that ids fit uint16)
//         16  u64     count (tokens after the header)
//         24  u32     crc32 of the token bytes (zlib's CRC-32, as Python's zlib.crc32)
//         28  u32     bytes per token (2)
// The shards of one split, <split>-00000.tok, <split>-00001.tok, ..., are one token stream in that order
// (documents run across shard boundaries). Each shard is checked when it is opened (size, checksum, ids): a
// shard that travelled to another machine is either intact or refused with the reason.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pathattn::model::lm {

constexpr char kShardMagic[8] = {'P', 'A', 'T', 'H', 'L', 'M', 'T', 'K'};
constexpr uint32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 32;

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);  // zlib's CRC-32 (reflected 0xEDB88320)

// One shard, memory-mapped read-only and checked at open (size, magic, version, checksum, every id < vocab);
// throws std::runtime_error naming the file and what was expected.
class MappedShard {
 public:
  explicit MappedShard(const std::string& path);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  const std::string& path() const { return path_; }
  uint32_t vocab() const { return vocab_; }
  uint32_t crc() const { return crc_; }
  int64_t size() const { return count_; }
  const uint16_t* tokens() const { return tokens_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
  uint32_t vocab_ = 0, crc_ = 0;
};

// Writes one shard (the tests use it; the data tool writes the same format from Python).
void write_shard(const std::string& path, uint32_t vocab, const std::vector<uint16_t>& tokens);

// The shards of one split in `dir`: <split>-00000.tok, ... numbered from 0 without gaps. max_shards > 0 keeps
// the first max_shards (a run pinned to a prefix of the data, whatever else was copied beside it). Throws when
// there is none, when the numbering has a gap, or when fewer than max_shards exist.
std::vector<std::string> split_shards(const std::string& dir, const std::string& split, int64_t max_shards = 0);

// One split as a single stream of tokens: its shards, mapped, concatenated in order. Reading a window copies
// from the mapped pages (the OS pages them in and out; nothing is loaded up front beyond the checks).
class TokenStream {
 public:
  explicit TokenStream(const std::vector<std::string>& shard_paths);

  int64_t size() const { return total_; }
  uint32_t vocab() const { return vocab_; }
  // tokens [start, start + n) of the stream into out (int64, as the model takes them); throws when out of range.
  void copy(int64_t start, int64_t n, int64_t* out) const;
  // What identifies this data: shard count, tokens and the shards' checksums (a checkpoint records it, so that
  // a resume on other data is refused).
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  std::vector<std::unique_ptr<MappedShard>> shards_;
  std::vector<int64_t> starts_;  // stream offset of each shard's first token
  int64_t total_ = 0;
  uint32_t vocab_ = 0;
  std::string fingerprint_;
};

}  // namespace pathattn::model::lm
