// The host side of the peer transport's device side (see the header).
#include "peer/peer_memory.h"

#include <cudaTypedefs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/cuda_status.h"
#include "cuda/driver_api.h"
#include "peer/peer_route.h"
#include "peer/region_offer.h"

namespace jax_tma {
namespace {

// Processes with a gone word of their own; any further ones share a word
// that stays zero (their waits end by timeout only).
constexpr int kMaxGoneWords = 4096;
constexpr std::chrono::milliseconds kReportEvery{20};

struct Driver {
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 free_address = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 retain = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 properties = nullptr;
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  std::string error;  // why an entry point is missing
};

const Driver& TheDriver() {
  static const Driver driver = [] {
    Driver d;
    auto get = [&d](auto& field, const char* name) {
      auto entry = ResolveDriverEntry<std::remove_reference_t<decltype(field)>>(name, 12000);
      field = entry.fn;
      if (entry.fn == nullptr && d.error.empty()) d.error = entry.error;
    };
    get(d.create, "cuMemCreate");
    get(d.release, "cuMemRelease");
    get(d.reserve, "cuMemAddressReserve");
    get(d.free_address, "cuMemAddressFree");
    get(d.map, "cuMemMap");
    get(d.set_access, "cuMemSetAccess");
    get(d.granularity, "cuMemGetAllocationGranularity");
    get(d.retain, "cuMemRetainAllocationHandle");
    get(d.export_handle, "cuMemExportToShareableHandle");
    get(d.import_handle, "cuMemImportFromShareableHandle");
    get(d.properties, "cuMemGetAllocationPropertiesFromHandle");
    get(d.address_range, "cuMemGetAddressRange");
    get(d.error_name, "cuGetErrorName");
    return d;
  }();
  return driver;
}

ffi::Error DriverFailed(const char* expr, CUresult r) {
  const char* name = nullptr;
  if (TheDriver().error_name == nullptr || TheDriver().error_name(r, &name) != CUDA_SUCCESS) {
    name = "an unknown error";
  }
  return ffi::Error::Internal(std::string(kPeerOp) + ": " + expr + " failed: " + name +
                              " (" + std::to_string(static_cast<int>(r)) + ")");
}

#define JAX_TMA_CU_RETURN_IF_ERROR(expr)                        \
  do {                                                          \
    const CUresult jax_tma_cu_ = (expr);                        \
    if (jax_tma_cu_ != CUDA_SUCCESS) return DriverFailed(#expr, jax_tma_cu_); \
  } while (0)

ffi::Error DriverReady() {
  if (!TheDriver().error.empty()) {
    return ffi::Error::Internal(std::string(kPeerOp) + ": " + TheDriver().error);
  }
  return ffi::Error::Success();
}

// Lets every local device that can read and write [va, va + size); device
// `required` (if >= 0) must be among them.
ffi::Error GrantAccess(CUdeviceptr va, size_t size, int required) {
  int count = 0;
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  bool any = false;
  for (int d = 0; d < count; ++d) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = d;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const CUresult r = TheDriver().set_access(va, size, &access, 1);
    if (r == CUDA_SUCCESS) {
      any = true;
    } else if (d == required || (d == count - 1 && !any)) {
      return DriverFailed("cuMemSetAccess", r);
    }
  }
  return ffi::Error::Success();
}

// ---- mailboxes ----

struct Slab {
  char* next = nullptr;
  char* end = nullptr;
};

// What this process holds for the transport (CountPeerResources), under
// resources_mu.
std::mutex resources_mu;
PeerResources resources;

// Zeroes device memory on a stream of its own: a legacy-stream memset would
// wait for XLA's streams, where a kernel may be waiting for this very setup.
ffi::Error ZeroOnOwnStream(void* p, size_t size) {
  cudaStream_t stream;
  JAX_TMA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaError_t err = cudaMemsetAsync(p, 0, size, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  JAX_TMA_CUDA_RETURN_IF_ERROR(err);
  return ffi::Error::Success();
}

// A zeroed allocation of at least `bytes` (at least one granule) on
// `device` that other processes may map, mapped here for every local device.
ffi::Error NewSlab(int device, size_t bytes, Slab* slab) {
  JAX_TMA_RETURN_IF_FAILED(DriverReady());
  const Driver& d = TheDriver();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granule = 0;
  JAX_TMA_CU_RETURN_IF_ERROR(
      d.granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = std::max<size_t>(1, (bytes + granule - 1) / granule) * granule;
  CUmemGenericAllocationHandle handle;
  JAX_TMA_CU_RETURN_IF_ERROR(d.create(&handle, size, &prop, 0));
  CUdeviceptr va = 0;
  CUresult r = d.reserve(&va, size, 0, 0, 0);
  if (r == CUDA_SUCCESS) r = d.map(va, size, 0, handle, 0);
  d.release(handle);  // the mapping keeps the memory
  if (r != CUDA_SUCCESS) return DriverFailed("mapping peer memory", r);
  {
    std::lock_guard<std::mutex> lock(resources_mu);
    ++resources.reservations;
  }
  JAX_TMA_RETURN_IF_FAILED(GrantAccess(va, size, device));
  JAX_TMA_RETURN_IF_FAILED(ZeroOnOwnStream(reinterpret_cast<void*>(va), size));
  slab->next = reinterpret_cast<char*>(va);
  slab->end = slab->next + size;
  return ffi::Error::Success();
}

// ---- addresses across processes ----

// An allocation of this process exported to others: where each mapped it.
struct Region {
  size_t size = 0;
  unsigned long long id = 0;
  std::map<int, unsigned long long> at;  // process -> its address of the base
};

std::mutex regions_mu;
std::map<uintptr_t, Region>& Regions() {  // by base address
  static auto* regions = new std::map<uintptr_t, Region>();
  return *regions;
}

// Where `p` lies in the allocation `to` mapped, or false.
bool Translate(uintptr_t p, int to, unsigned long long* out) {
  std::lock_guard<std::mutex> lock(regions_mu);
  auto it = Regions().upper_bound(p);
  if (it == Regions().begin()) return false;
  --it;
  if (p >= it->first + it->second.size) return false;
  auto at = it->second.at.find(to);
  if (at == it->second.at.end()) return false;
  *out = at->second + (p - it->first);
  return true;
}

// Exports the allocation holding `p` to `to` and waits for its mapping there.
ffi::Error ExportRegion(const LinkPeer& to, uintptr_t p, std::chrono::milliseconds timeout,
                        const std::string& abort_key) {
  JAX_TMA_RETURN_IF_FAILED(DriverReady());
  const Driver& d = TheDriver();
  CUdeviceptr base = 0;
  size_t size = 0;
  JAX_TMA_CU_RETURN_IF_ERROR(d.address_range(&base, &size, static_cast<CUdeviceptr>(p)));
  CUmemGenericAllocationHandle handle;
  CUresult r = d.retain(&handle, reinterpret_cast<void*>(base));
  if (r != CUDA_SUCCESS) {
    return ffi::Error::InvalidArgument(
        std::string(kPeerOp) + ": the buffer at " + std::to_string(p) +
        " is not in a VMM allocation (cuMemRetainAllocationHandle failed), so no other "
        "process can map it; across processes the op needs XLA's default GPU allocator");
  }
  int fd = -1;
  r = d.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  d.release(handle);
  if (r != CUDA_SUCCESS) {
    return ffi::Error::InvalidArgument(
        std::string(kPeerOp) + ": the allocation holding the buffer at " +
        std::to_string(p) + " cannot be exported as a POSIX file descriptor (" +
        std::to_string(static_cast<int>(r)) + "), so no other process can map it");
  }
  RegionOffer offer{0, size};
  {
    std::lock_guard<std::mutex> lock(regions_mu);
    static unsigned long long next_id = 1;
    Region& region = Regions()[base];
    if (region.id == 0) region = Region{size, next_id++, {}};
    offer.id = region.id;
  }
  const std::string key = RegionOfferKey(offer.id);
  ffi::Error err = SendLink(to, key, std::string_view(reinterpret_cast<const char*>(&offer),
                                                      sizeof(offer)),
                            fd);
  close(fd);
  JAX_TMA_RETURN_IF_FAILED(err);
  std::string reply;
  JAX_TMA_RETURN_IF_FAILED(ReceiveLink(to, key + "/at", abort_key,
                                       "the mapping of an allocation of this process",
                                       timeout, &reply));
  unsigned long long va = 0;
  if (reply.size() >= sizeof(va)) std::memcpy(&va, reply.data(), sizeof(va));
  if (va == 0) {
    return ffi::Error::Internal(std::string(kPeerOp) + ": process " +
                                std::to_string(to.process) +
                                " could not map an allocation of this process: " +
                                reply.substr(std::min(reply.size(), sizeof(va))));
  }
  {
    std::lock_guard<std::mutex> lock(resources_mu);
    ++resources.exported;
  }
  std::lock_guard<std::mutex> lock(regions_mu);
  Regions()[base].at[to.process] = va;
  return ffi::Error::Success();
}

// The most memory of any GPU this process sees: no allocation of a peer's
// GPU is larger (the GPUs of one host are of one kind).
size_t LargestGpuMemory() {
  static const size_t largest = [] {
    int count = 0;
    size_t most = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) return most;
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp prop;
      if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) {
        most = std::max(most, prop.totalGlobalMem);
      }
    }
    return most;
  }();
  return largest;
}

// Maps an allocation another process offered (its descriptor passed
// CheckRegionOffer); its address here, or 0 and why not. The allocation
// must be GPU memory, and `size` a whole number of its granules within one
// GPU's memory, before any address space is reserved for it.
unsigned long long ImportRegion(int fd, size_t size, std::string* why) {
  auto fail = [&](ffi::Error err) {
    *why = std::string(err.message());
    return 0ull;
  };
  if (ffi::Error err = DriverReady(); err.failure()) return fail(std::move(err));
  const Driver& d = TheDriver();
  // The driver calls below need a context: device 0's primary one.
  if (cudaError_t err = cudaSetDevice(0); err != cudaSuccess) {
    return fail(CudaError("cudaSetDevice(0)", err, __FILE__, __LINE__));
  }
  CUmemGenericAllocationHandle handle;
  CUresult r = d.import_handle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return fail(DriverFailed("cuMemImportFromShareableHandle", r));
  CUmemAllocationProp prop{};
  size_t granularity = 0;
  r = d.properties(&prop, handle);
  if (r == CUDA_SUCCESS) r = d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) {
    d.release(handle);
    return fail(DriverFailed("reading the offered allocation's properties", r));
  }
  if (prop.type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    d.release(handle);
    *why = (Message() << kPeerOp << ": the offered allocation is not GPU memory (type "
                      << static_cast<int>(prop.type) << ", location type "
                      << static_cast<int>(prop.location.type) << ")")
               .str();
    return 0;
  }
  if (granularity == 0 || size % granularity != 0 || size > LargestGpuMemory()) {
    d.release(handle);
    *why = (Message() << kPeerOp << ": an offer of " << size << " bytes is no whole number "
                      << "of " << granularity << "-byte granules within one GPU's memory ("
                      << LargestGpuMemory() << " bytes)")
               .str();
    return 0;
  }
  CUdeviceptr va = 0;
  r = d.reserve(&va, size, 0, 0, 0);
  if (r == CUDA_SUCCESS) {
    // Fails where the allocation is smaller than the offer says.
    r = d.map(va, size, 0, handle, 0);
    if (r != CUDA_SUCCESS) d.free_address(va, size);
  }
  d.release(handle);
  if (r != CUDA_SUCCESS) return fail(DriverFailed("mapping an allocation of another process", r));
  {
    std::lock_guard<std::mutex> lock(resources_mu);
    ++resources.reservations;
    ++resources.imported;
  }
  if (ffi::Error err = GrantAccess(va, size, -1); err.failure()) return fail(std::move(err));
  return static_cast<unsigned long long>(va);
}

// The link's reader thread: maps offered allocations and answers where (or
// why not) to the sender's published name.
bool OnLinkMessage(int sender, const std::string& key, LinkMessage* message) {
  unsigned long long id;
  if (!IsRegionOfferKey(key, &id)) return false;
  RegionOffer offer;
  std::string why = CheckRegionOffer(id, message->bytes, message->fd, &offer);
  unsigned long long va = 0;
  if (why.empty()) va = ImportRegion(message->fd, offer.size, &why);
  if (message->fd >= 0) close(message->fd);
  std::string reply(sizeof(va), '\0');
  std::memcpy(reply.data(), &va, sizeof(va));
  if (va == 0) reply += why;
  // Best effort: a sender that is gone no longer waits for the answer.
  (void)SendLink(KnownLinkPeer(sender), key + "/at", reply);
  return true;
}

// ---- gone words and faults ----

std::mutex gone_mu;
unsigned int* gone_words = nullptr;  // kMaxGoneWords + 1, host-mapped, under gone_mu
std::set<int>& GoneBeforeWords() {   // processes gone before the words existed
  static auto* gone = new std::set<int>();
  return *gone;
}
PeerFault* fault_record = nullptr;

void OnPeerGone(int process) {
  if (process < 0 || process >= kMaxGoneWords) return;
  std::lock_guard<std::mutex> lock(gone_mu);
  if (gone_words == nullptr) {
    GoneBeforeWords().insert(process);
  } else {
    reinterpret_cast<volatile unsigned int*>(gone_words)[process] = 1;
  }
}

struct Waits {
  std::string op, site, publisher, copier;
  std::chrono::milliseconds timeout{0};
};
std::mutex waits_mu;
std::map<unsigned long long, Waits>& AllWaits() {  // by id, from 1
  static auto* waits = new std::map<unsigned long long, Waits>();
  return *waits;
}

// Host memory that every device reads and writes.
template <typename T>
ffi::Error HostMapped(size_t count, T** out) {
  void* p = nullptr;
  JAX_TMA_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(p, 0, count * sizeof(T));
  *out = static_cast<T*>(p);
  return ffi::Error::Success();
}

// Allocates the gone words and the fault record and starts the reporting
// thread, once per process.
ffi::Error StartHost() {
  static const ffi::Error* started = [] {
    unsigned int* words = nullptr;
    ffi::Error err = HostMapped(kMaxGoneWords + 1, &words);
    if (err.success()) {
      std::lock_guard<std::mutex> lock(gone_mu);
      for (int p : GoneBeforeWords()) words[p] = 1;
      gone_words = words;
    }
    if (err.success()) err = HostMapped(1, &fault_record);
    if (err.success()) {
      std::thread([] {
        // Reports the first fault a kernel records, then ends.
        const volatile PeerFault* f = fault_record;
        while (f->raised == 0) std::this_thread::sleep_for(kReportEvery);
        std::fprintf(stderr, "%s\n", std::string(RecordedPeerFault().message()).c_str());
        std::fflush(stderr);
      }).detach();
    }
    return new ffi::Error(std::move(err));
  }();
  return started->failure() ? ffi::Error(*started->errc(), std::string(started->message()))
                            : ffi::Error::Success();
}

}  // namespace

void InstallPeerLinkHandlers() { SetLinkHandlers(OnLinkMessage, OnPeerGone); }

namespace {
std::mutex mailboxes_mu;
std::map<int, Slab>& Slabs() {  // by device: where the next new mailbox goes
  static auto* slabs = new std::map<int, Slab>();
  return *slabs;
}
std::map<int, std::vector<PeerMailbox*>>& FreeMailboxes() {  // by device
  static auto* free = new std::map<int, std::vector<PeerMailbox*>>();
  return *free;
}
}  // namespace

ffi::Error NewPeerMailbox(int device, PeerMailbox** box) {
  JAX_TMA_RETURN_IF_FAILED(StartHost());
  std::lock_guard<std::mutex> lock(mailboxes_mu);
  std::vector<PeerMailbox*>& free = FreeMailboxes()[device];
  if (!free.empty()) {
    JAX_TMA_RETURN_IF_FAILED(ZeroOnOwnStream(free.back(), sizeof(PeerMailbox)));
    *box = free.back();
    free.pop_back();
  } else {
    Slab& slab = Slabs()[device];
    if (slab.end - slab.next < static_cast<std::ptrdiff_t>(sizeof(PeerMailbox))) {
      JAX_TMA_RETURN_IF_FAILED(NewSlab(device, sizeof(PeerMailbox), &slab));
    }
    *box = reinterpret_cast<PeerMailbox*>(slab.next);
    slab.next += sizeof(PeerMailbox);
  }
  std::lock_guard<std::mutex> count(resources_mu);
  ++resources.mailboxes;
  return ffi::Error::Success();
}

void ReleasePeerMailbox(int device, PeerMailbox* box) {
  std::lock_guard<std::mutex> lock(mailboxes_mu);
  FreeMailboxes()[device].push_back(box);
  std::lock_guard<std::mutex> count(resources_mu);
  --resources.mailboxes;
}

namespace {
std::mutex inboxes_mu;
std::map<int, std::vector<Slab>>& FreeInboxes() {  // by device
  static auto* free = new std::map<int, std::vector<Slab>>();
  return *free;
}
std::map<void*, Slab>& InboxesInUse() {
  static auto* used = new std::map<void*, Slab>();
  return *used;
}
}  // namespace

ffi::Error NewPeerInbox(int device, size_t bytes, void** inbox) {
  JAX_TMA_RETURN_IF_FAILED(StartHost());
  std::lock_guard<std::mutex> lock(inboxes_mu);
  std::vector<Slab>& free = FreeInboxes()[device];
  // The smallest free one that holds `bytes`.
  auto best = free.end();
  for (auto it = free.begin(); it != free.end(); ++it) {
    if (static_cast<size_t>(it->end - it->next) >= bytes &&
        (best == free.end() || it->end - it->next < best->end - best->next)) {
      best = it;
    }
  }
  Slab slab;
  if (best != free.end()) {
    JAX_TMA_RETURN_IF_FAILED(ZeroOnOwnStream(best->next, bytes));
    slab = *best;
    free.erase(best);
  } else {
    JAX_TMA_RETURN_IF_FAILED(NewSlab(device, bytes, &slab));
  }
  InboxesInUse()[slab.next] = slab;
  *inbox = slab.next;
  std::lock_guard<std::mutex> count(resources_mu);
  ++resources.inboxes;
  return ffi::Error::Success();
}

void ReleasePeerInbox(int device, void* inbox) {
  std::lock_guard<std::mutex> lock(inboxes_mu);
  auto it = InboxesInUse().find(inbox);
  if (it == InboxesInUse().end()) return;
  FreeInboxes()[device].push_back(it->second);
  InboxesInUse().erase(it);
  std::lock_guard<std::mutex> count(resources_mu);
  --resources.inboxes;
}

ffi::Error AddressIn(const LinkPeer& to, int device, const void* ptr,
                     std::chrono::milliseconds timeout, const std::string& abort_key,
                     unsigned long long* out) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (to.name.empty()) {
    *out = p;
    return ffi::Error::Success();
  }
  if (Translate(p, to.process, out)) return ffi::Error::Success();
  JAX_TMA_RETURN_IF_FAILED(StartHost());
  // Off this thread: XLA may be capturing a command buffer on it.
  ffi::Error err = ffi::Error::Success();
  std::thread([&] {
    const cudaError_t set = cudaSetDevice(device);  // the driver calls need its context
    err = set == cudaSuccess ? ExportRegion(to, p, timeout, abort_key)
                             : CudaError("cudaSetDevice(device)", set, __FILE__, __LINE__);
  }).join();
  JAX_TMA_RETURN_IF_FAILED(err);
  if (!Translate(p, to.process, out)) {
    return ffi::Error::Internal(std::string(kPeerOp) +
                                ": an exported allocation has no mapping");
  }
  return ffi::Error::Success();
}

ffi::Error PeerGoneWord(int process, const volatile unsigned int** word) {
  JAX_TMA_RETURN_IF_FAILED(StartHost());
  std::lock_guard<std::mutex> lock(gone_mu);
  *word = gone_words + (process >= 0 && process < kMaxGoneWords ? process : kMaxGoneWords);
  return ffi::Error::Success();
}

ffi::Error ThePeerFault(PeerFault** fault) {
  JAX_TMA_RETURN_IF_FAILED(StartHost());
  *fault = fault_record;
  return ffi::Error::Success();
}

unsigned long long RegisterPeerWaits(std::string op, std::string site, std::string publisher,
                                     std::string copier, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(waits_mu);
  static unsigned long long next_id = 1;
  AllWaits()[next_id] = Waits{std::move(op), std::move(site), std::move(publisher),
                              std::move(copier), timeout};
  return next_id++;
}

void UnregisterPeerWaits(unsigned long long id) {
  const volatile PeerFault* f = fault_record;
  std::lock_guard<std::mutex> lock(waits_mu);
  // A recorded fault keeps naming its waits.
  if (f == nullptr || f->raised == 0 || f->site != id) AllWaits().erase(id);
}

PeerResources CountPeerResources() {
  PeerResources counts;
  {
    std::lock_guard<std::mutex> lock(resources_mu);
    counts = resources;
  }
  std::lock_guard<std::mutex> lock(waits_mu);
  counts.sites = static_cast<long long>(AllWaits().size());
  return counts;
}

namespace {

// A ragged exchange's or a pull's broken index rule (PeerSizeRule), as an
// error.
ffi::Error BadSizeFault(const volatile PeerFault* f, const Waits& w) {
  const long long i = f->index, value = static_cast<long long>(f->call),
                  size = static_cast<long long>(f->seen), limit = f->limit;
  Message m;
  m << w.op << " at " << w.site << ": ";
  switch (static_cast<PeerSizeRule>(f->rule)) {
    case PeerSizeRule::kOperand:
      m << "slice " << i << ": input_offsets[" << i << "] = " << value << " and send_sizes[" << i
        << "] = " << size << " are negative or run past the operand's " << limit << " rows";
      break;
    case PeerSizeRule::kOutput:
      m << "slice " << i << ": output_offsets[" << i << "] = " << value << " and send_sizes["
        << i << "] = " << size << " are negative or run past the output's " << limit << " rows";
      break;
    case PeerSizeRule::kPullRoute:  // size: the column
      m << "routes[" << i << ", " << size << "] = " << value << " is outside [0, " << limit
        << "]";
      break;
    case PeerSizeRule::kPullToken:
      m << "sent[" << i << ", 0] = " << value << " is outside [0, " << limit << "]";
      break;
    case PeerSizeRule::kPullSlot:  // size: the column
      m << "sent[" << i << ", " << size << "] = " << value << " is neither -1 nor a row of "
        << "the result's " << limit;
      break;
    case PeerSizeRule::kSumSlot:  // i: the flat entry, size: the choices
      m << "slots[" << i / std::max(size, 1LL) << ", " << i % std::max(size, 1LL) << "] = "
        << value << " is neither -1 nor a row of y's " << limit;
      break;
    default:
      m << "slice " << i << ": send_sizes[" << i << "] = " << size << " but its receiver's "
        << "recv_sizes entry for it is " << value;
  }
  m << ". The indices are checked on the device before the copies they steer, so no copy ran "
       "out of bounds; the checking kernel trapped, and this process's GPU context is lost: "
       "restart the processes";
  return ffi::Error::InvalidArgument(m.str());
}

}  // namespace

ffi::Error RecordedPeerFault() {
  const volatile PeerFault* f = fault_record;
  if (f == nullptr || f->raised == 0) return ffi::Error::Success();
  Waits w;
  {
    std::lock_guard<std::mutex> lock(waits_mu);
    auto it = AllWaits().find(static_cast<unsigned long long>(f->site));
    if (it != AllWaits().end()) w = it->second;
  }
  if (f->gave_up == static_cast<unsigned int>(PeerGaveUp::kBadSize)) return BadSizeFault(f, w);
  const bool publish = f->wait_for == static_cast<unsigned int>(PeerWaitFor::kPublish);
  const std::string who = publish ? w.publisher : w.copier;
  const std::string action =
      std::string(publish ? "publish its buffer for" : "finish its copy in") + " call " +
      std::to_string(f->call);
  Message m;
  m << w.op << " at " << w.site << ": ";
  ffi::ErrorCode code = ffi::ErrorCode::kInternal;
  switch (static_cast<PeerGaveUp>(f->gave_up)) {
    case PeerGaveUp::kTimeout:
      code = ffi::ErrorCode::kDeadlineExceeded;
      m << "timed out after " << w.timeout.count() / 1000.0 << " s waiting for " << who << " to "
        << action << "; it never made this call, is stuck, or is making another one";
      break;
    case PeerGaveUp::kGone:
      code = ffi::ErrorCode::kUnavailable;
      m << "the process of " << who << " is gone (its connection closed) while this device "
        << "waited for it to " << action;
      break;
    default:
      m << who << " signalled call " << f->seen << " while this device waited for it to "
        << action << ": the processes are out of step";
  }
  m << ". The waiting kernel trapped, so the step failed instead of returning a block that "
       "never came, and this process's GPU context is lost: restart the processes";
  return ffi::Error(code, m.str());
}

}  // namespace jax_tma
