#include "dir_ops.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace pathattn::model {

std::vector<std::string> list_folder(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) throw std::runtime_error("cannot list folder '" + dir + "': " + std::strerror(errno));
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  const int err = errno;
  closedir(d);
  if (err != 0) throw std::runtime_error("cannot list folder '" + dir + "': " + std::strerror(err));
  std::sort(names.begin(), names.end());
  return names;
}

namespace {
// nftw's callback (depth first: a folder after its entries). The failing path is kept for the error message.
thread_local std::string g_failed;
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) != 0) {
    g_failed = std::string(path) + "': " + std::strerror(errno);
    return 1;
  }
  return 0;
}
}  // namespace

void remove_tree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw std::runtime_error("cannot remove '" + path + "': " + std::strerror(errno));
  }
  g_failed.clear();
  if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    throw std::runtime_error("cannot remove '" + (g_failed.empty() ? path + "'" : g_failed));
}

}  // namespace pathattn::model
