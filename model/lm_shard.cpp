#include "lm_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "dir_ops.h"

namespace pathattn::model::lm {

namespace fs = std::filesystem;

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}

template <typename T>
T read_le(const unsigned char* p) {  // the format is little-endian; so is every machine this runs on (x86, arm64)
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string shard_name(const std::string& split, int64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%05ld.tok", static_cast<long>(i));
  return split + buf;
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const auto table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

MappedShard::MappedShard(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) { throw std::runtime_error("shard " + path + ": " + what); };
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(std::string("cannot stat: ") + std::strerror(errno));
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  if (map_bytes_ < kShardHeaderBytes) {
    ::close(fd);
    fail("truncated: " + std::to_string(map_bytes_) + " bytes, expected at least the " +
         std::to_string(kShardHeaderBytes) + "-byte header");
  }
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(std::string("cannot mmap: ") + std::strerror(errno));
  }
  try {
    const auto* h = static_cast<const unsigned char*>(map_);
    if (std::memcmp(h, kShardMagic, sizeof kShardMagic) != 0)
      fail("bad magic: expected \"PATHLMTK\" (a shard written by tools/lm_data.py)");
    const auto version = read_le<uint32_t>(h + 8);
    if (version != kShardVersion)
      fail("version " + std::to_string(version) + ", expected " + std::to_string(kShardVersion));
    vocab_ = read_le<uint32_t>(h + 12);
    const auto count = read_le<uint64_t>(h + 16);
    crc_ = read_le<uint32_t>(h + 24);
    const auto token_bytes = read_le<uint32_t>(h + 28);
    if (token_bytes != 2) fail("bytes per token " + std::to_string(token_bytes) + ", expected 2 (uint16)");
    if (vocab_ == 0 || vocab_ > 65536) fail("vocab " + std::to_string(vocab_) + ", expected 1..65536");
    const size_t expected = kShardHeaderBytes + 2 * count;
    if (map_bytes_ != expected)
      fail((map_bytes_ < expected ? "truncated: " : "trailing bytes: ") + std::to_string(map_bytes_) +
           " bytes, expected " + std::to_string(expected) + " for " + std::to_string(count) + " tokens");
    count_ = static_cast<int64_t>(count);
    tokens_ = reinterpret_cast<const uint16_t*>(h + kShardHeaderBytes);
    const uint32_t got = crc32(tokens_, 2 * count);
    if (got != crc_)
      fail("checksum mismatch: crc32 of the tokens is " + std::to_string(got) + ", the header says " +
           std::to_string(crc_) + " (corrupted in transfer?)");
    for (int64_t i = 0; i < count_; ++i) {
      if (tokens_[i] >= vocab_)
        fail("token " + std::to_string(tokens_[i]) + " at " + std::to_string(i) + " is not below vocab " +
             std::to_string(vocab_));
    }
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

MappedShard::~MappedShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

void write_shard(const std::string& path, uint32_t vocab, const std::vector<uint16_t>& tokens) {
  unsigned char h[kShardHeaderBytes] = {};
  std::memcpy(h, kShardMagic, sizeof kShardMagic);
  const uint32_t version = kShardVersion, crc = crc32(tokens.data(), 2 * tokens.size()), tb = 2;
  const uint64_t count = tokens.size();
  std::memcpy(h + 8, &version, 4);
  std::memcpy(h + 12, &vocab, 4);
  std::memcpy(h + 16, &count, 8);
  std::memcpy(h + 24, &crc, 4);
  std::memcpy(h + 28, &tb, 4);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("shard " + path + ": cannot create");
  f.write(reinterpret_cast<const char*>(h), sizeof h);
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(2 * tokens.size()));
  if (!f) throw std::runtime_error("shard " + path + ": write failed");
}

std::vector<std::string> split_shards(const std::string& dir, const std::string& split, int64_t max_shards) {
  if (!fs::is_directory(dir)) throw std::runtime_error("lm data: " + dir + " is not a folder");
  // Every <split>-NNNNN.tok present, so that a gap (a shard that did not arrive) is an error, not less data.
  int64_t present = 0, highest = -1;
  const std::string prefix = split + "-";
  for (const std::string& n : list_folder(dir)) {
    if (n.size() == prefix.size() + 9 && n.compare(0, prefix.size(), prefix) == 0 && n.substr(n.size() - 4) == ".tok") {
      ++present;
      highest = std::max<int64_t>(highest, std::stoll(n.substr(prefix.size(), 5)));
    }
  }
  if (present == 0) throw std::runtime_error("lm data: no " + split + "-00000.tok in " + dir);
  if (present != highest + 1)
    throw std::runtime_error("lm data: " + split + " shards in " + dir + " have gaps (" + std::to_string(present) +
                             " files, highest number " + std::to_string(highest) + ")");
  if (max_shards > present)
    throw std::runtime_error("lm data: " + std::to_string(max_shards) + " " + split + " shards asked for, " + dir +
                             " has " + std::to_string(present));
  const int64_t n = max_shards > 0 ? max_shards : present;
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back((fs::path(dir) / shard_name(split, i)).string());
  return out;
}

TokenStream::TokenStream(const std::vector<std::string>& shard_paths) {
  if (shard_paths.empty()) throw std::invalid_argument("TokenStream: expected at least one shard");
  fingerprint_ = "shards=" + std::to_string(shard_paths.size());
  uint32_t combined = 0;
  for (const auto& p : shard_paths) {
    shards_.push_back(std::make_unique<MappedShard>(p));
    const auto& s = *shards_.back();
    if (vocab_ == 0) vocab_ = s.vocab();
    if (s.vocab() != vocab_)
      throw std::runtime_error("shard " + p + ": vocab " + std::to_string(s.vocab()) + ", expected " +
                               std::to_string(vocab_) + " as " + shard_paths[0]);
    starts_.push_back(total_);
    total_ += s.size();
    const uint32_t c = s.crc();
    combined = crc32(&c, sizeof c, combined);
  }
  fingerprint_ +=
      " tokens=" + std::to_string(total_) + " vocab=" + std::to_string(vocab_) + " crc=" + std::to_string(combined);
}

void TokenStream::copy(int64_t start, int64_t n, int64_t* out) const {
  if (start < 0 || n < 0 || start + n > total_)
    throw std::out_of_range("TokenStream::copy: [" + std::to_string(start) + ", " + std::to_string(start + n) +
                            ") is outside the stream of " + std::to_string(total_) + " tokens");
  // The shard holding `start`, then forward across shard boundaries.
  size_t s = std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1;
  while (n > 0) {
    const auto& sh = *shards_[s];
    const int64_t off = start - starts_[s], take = std::min(n, sh.size() - off);
    for (int64_t i = 0; i < take; ++i) out[i] = sh.tokens()[off + i];
    out += take;
    start += take;
    n -= take;
    ++s;
  }
}

}  // namespace pathattn::model::lm
