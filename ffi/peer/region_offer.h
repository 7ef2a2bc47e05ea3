// The message in which a process offers another the VMM allocation that
// holds its buffers (peer_memory.cc): key "jax_tma/region/<id>", a
// RegionOffer and the allocation's descriptor; the answer goes back under
// "<key>/at". Host C++, so that the checks an offer passes before the GPU
// driver sees its descriptor are unit-tested without a GPU (tests/cpp).
#ifndef JAX_TMA_FFI_PEER_REGION_OFFER_H_
#define JAX_TMA_FFI_PEER_REGION_OFFER_H_

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "message.h"

namespace jax_tma {

struct RegionOffer {
  unsigned long long id = 0;
  unsigned long long size = 0;  // bytes of the allocation
};

inline constexpr std::string_view kRegionKey = "jax_tma/region/";

inline std::string RegionOfferKey(unsigned long long id) {
  return std::string(kRegionKey) + std::to_string(id);
}

// Whether `key` is an offer's (the prefix and a decimal id, nothing after:
// the answers under "<key>/at" are not), and its id.
inline bool IsRegionOfferKey(std::string_view key, unsigned long long* id) {
  if (key.substr(0, kRegionKey.size()) != kRegionKey) return false;
  const std::string_view digits = key.substr(kRegionKey.size());
  if (digits.empty() || digits.size() > 19) return false;  // 19 digits fit 64 bits
  *id = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    *id = *id * 10 + static_cast<unsigned long long>(c - '0');
  }
  return true;
}

// What is wrong with the offer `id` that came as `bytes` with descriptor
// `fd` (-1: none); empty if nothing, with the offer in `out`. The GPU
// driver's exported allocations are character devices (its control device),
// so a file, pipe or socket never reaches cuMemImportFromShareableHandle.
inline std::string CheckRegionOffer(unsigned long long id, std::string_view bytes, int fd,
                                    RegionOffer* out) {
  Message m;
  if (bytes.size() != sizeof(RegionOffer)) {
    m << "an offer of " << bytes.size() << " bytes (a region offer has "
      << sizeof(RegionOffer) << ")";
    return m.str();
  }
  std::memcpy(out, bytes.data(), sizeof(*out));
  struct stat st;
  if (out->id != id) {
    m << "the offer names allocation " << out->id << " under the key of allocation " << id;
  } else if (out->size == 0) {
    m << "an offer of an allocation of 0 bytes";
  } else if (fd < 0) {
    m << "no descriptor came with the offer";
  } else if (fstat(fd, &st) != 0) {
    m << "fstat of the offered descriptor failed: " << std::strerror(errno);
  } else if (!S_ISCHR(st.st_mode)) {
    m << "the offered descriptor is "
      << (S_ISREG(st.st_mode)    ? "a regular file"
          : S_ISFIFO(st.st_mode) ? "a pipe"
          : S_ISSOCK(st.st_mode) ? "a socket"
          : S_ISDIR(st.st_mode)  ? "a directory"
          : S_ISBLK(st.st_mode)  ? "a block device"
                                 : "no file of a known type")
      << ", not the GPU driver's character device";
  }
  return m.str();
}

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_PEER_REGION_OFFER_H_
