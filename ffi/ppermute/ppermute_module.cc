// What jax_tma.ppermute's Python side calls besides its handlers (see
// module_defs.h): the start of this process's end of the process link,
// whether one GPU can map another's memory, and what the GPU transport
// holds (for the tests that look for leaks).
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include "module_defs.h"
#include "ppermute/peer_link.h"

#if JAX_TMA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "ppermute/peer_memory.h"
#endif

namespace jax_tma {

void PpermuteModule(nanobind::module_& m) {
  // Starts this process's end of the process link (peer_link.h), with the
  // GPU transport's handlers where CUDA is built, before its name is
  // published.
  m.def(
      "listen_link",
      [](const std::string& name, int process) {
        ffi::Error err = ListenLink(LinkPeer{process, name});
        if (err.failure()) throw std::runtime_error(std::string(err.message()));
#if JAX_TMA_WITH_CUDA
        InstallPeerLinkHandlers();
#endif
      },
      nanobind::arg("name"), nanobind::arg("process"));
#if JAX_TMA_WITH_CUDA
  // Whether `device` can map `peer`'s memory (what ppermute reads through);
  // lowering falls back to lax.ppermute where it cannot.
  m.def(
      "can_access_peer",
      [](int device, int peer) {
        if (device == peer) return true;
        int can = 0;
        const cudaError_t err = cudaDeviceCanAccessPeer(&can, device, peer);
        if (err != cudaSuccess) {
          throw std::runtime_error(std::string("cudaDeviceCanAccessPeer: ") +
                                   cudaGetErrorString(err));
        }
        return can != 0;
      },
      nanobind::arg("device"), nanobind::arg("peer"));
  // CountPeerResources (peer_memory.h) by name.
  m.def("peer_resources", []() {
    const PeerResources r = CountPeerResources();
    return std::map<std::string, long long>{{"sites", r.sites},
                                            {"mailboxes", r.mailboxes},
                                            {"reservations", r.reservations},
                                            {"imported", r.imported},
                                            {"exported", r.exported}};
  });
#endif
}

}  // namespace jax_tma
