// What jax_tma.ppermute's Python side calls besides its handlers (see
// module_defs.h): the start of this process's end of the process link, who
// its peers are and what it refused, whether one GPU can map another's
// memory, and what the GPU transport holds (for the tests that look for
// leaks).
#include <chrono>
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "module_defs.h"
#include "peer/peer_link.h"
#include "ppermute/all_to_all.h"

#if JAX_TMA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "peer/peer_memory.h"
#endif

namespace jax_tma {

void PpermuteModule(nanobind::module_& m) {
  // Starts this process's end of the process link (peer_link.h), with the
  // GPU transport's handlers where CUDA is built, before its name is
  // published.
  m.def(
      "listen_link",
      [](const std::string& name, int process, long long timeout_ms) {
        ffi::Error err =
            ListenLink(LinkPeer{process, name}, std::chrono::milliseconds(timeout_ms));
        if (err.failure()) throw std::runtime_error(std::string(err.message()));
#if JAX_TMA_WITH_CUDA
        InstallPeerLinkHandlers();
#endif
      },
      nanobind::arg("name"), nanobind::arg("process"), nanobind::arg("timeout_ms"));
  // Who process `process` is, as it published itself in the key-value
  // store: connections claiming to be it must come from `pid`.
  m.def(
      "know_link_peer",
      [](int process, const std::string& name, long long pid) {
        ffi::Error err = KnowLinkPeer(LinkPeer{process, name}, pid);
        if (err.failure()) throw std::runtime_error(std::string(err.message()));
      },
      nanobind::arg("process"), nanobind::arg("name"), nanobind::arg("pid"));
  // The largest exchange (operand bytes a participant) that all_to_all and
  // ragged_all_to_all run through the inbox on a GPU (all_to_all.h): the
  // combine's choice of its exchange home (jax_tma/_moe.py), and the tests
  // that check which path ran.
  m.attr("exchange_inbox_max_bytes") = kPeerInboxMaxBytes;
  // An eventfd that becomes readable when the link refused something, and
  // the refusals since the last call (peer_link.h).
  m.def("link_refusal_signal", &LinkRefusalSignal);
  m.def("link_refusals", &TakeLinkRefusals);
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
                                            {"inboxes", r.inboxes},
                                            {"reservations", r.reservations},
                                            {"imported", r.imported},
                                            {"exported", r.exported}};
  });
#endif
}

}  // namespace jax_tma
