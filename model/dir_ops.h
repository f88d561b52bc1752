// Folder listing and recursive removal without std::filesystem's directory iterators.
//
// Why: libtorch_cpu.so of torch >= 2.5 (pip wheels, built with an older GCC) exports the copies of libstdc++'s
// std::filesystem iterators that it linked statically (pytorch/pytorch#133437). In a program built with another GCC
// (g++ 13 on the GPU machine) the dynamic linker binds our calls to those copies, whose layout of the iterator's
// state differs from our inline code's: fs::remove_all of a non-empty folder crashed with SIGSEGV on the H200
// machine (torch 2.11), on CUDA and CPU alike, in the trainer's second checkpoint (docs/results/synthetic/README.md).
// These use POSIX (opendir / readdir, nftw) instead; everything in model/ and its tests that walks a folder goes
// through them. The other std::filesystem calls (exists, rename, create_directories) do not iterate and are used.
#pragma once

#include <string>
#include <vector>

namespace pathattn::model {

// The names in folder dir (without "." and ".."), sorted; throws std::runtime_error naming dir if it cannot be read.
std::vector<std::string> list_folder(const std::string& dir);

// Removes path and, if it is a folder, everything under it (symbolic links are removed, not followed); no error if
// path does not exist. Throws std::runtime_error naming the entry that could not be removed.
void remove_tree(const std::string& path);

}  // namespace pathattn::model
