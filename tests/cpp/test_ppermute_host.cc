// The process link of the peer transport (ffi/peer/peer_link.h) between
// two real processes (fork): bytes and a file descriptor travel (a memfd
// both map: one page of shared memory, taken by the receiver's handler),
// aborts reach the waiter with their reason, waits time out, a process that
// exits is gone at once, and a name nothing listens on is refused. Then the
// link's defences, each against a forked process that speaks the wire format
// by hand: connections from unknown pids, other uids and false claims are
// refused, a peer that breaks the wire format is cut off, each is recorded
// once (with its pid and uid) and changes nothing else, and an impostor at a
// peer's name is sent nothing. Last, a meeting of the two processes
// (ffi/peer/peer_exchange.h) refuses a payload of the wrong size,
// and the checks of a GPU region offer (ffi/peer/region_offer.h) that
// need no GPU.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>

#include "check.h"
#include "peer/peer_exchange.h"
#include "peer/peer_link.h"
#include "peer/peer_route.h"
#include "peer/region_offer.h"

namespace jax_tma {
namespace {

using std::chrono::milliseconds;

std::string Name(int process) {
  return "jax_tma.test_ppermute_host." + std::to_string(getpid()) + "." + std::to_string(process);
}

char* MapPage(int fd) {
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

// Whether `text` contains `part`.
bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Whether `err` failed with `code` and says `text`.
bool FailedWith(const ffi::Error& err, ffi::ErrorCode code, const std::string& text) {
  return err.failure() && *err.errc() == code && Has(std::string(err.message()), text);
}

// Waits for `key` (abort key "abort:" + key) from `from`; `took` receives how
// long the wait lasted.
ffi::Error TimedReceive(const LinkPeer& from, const std::string& key, const std::string& what,
                        milliseconds timeout, std::chrono::steady_clock::duration* took) {
  std::string got;
  const auto start = std::chrono::steady_clock::now();
  ffi::Error err = ReceiveLink(from, key, "abort:" + key, what, timeout, &got);
  *took = std::chrono::steady_clock::now() - start;
  return err;
}

// Process 1's handler: takes the page, answers through it and says so.
bool TakePage(int sender, const std::string& key, LinkMessage* message) {
  if (key != "page") return false;
  CHECK_EQ(sender, 0);
  CHECK_EQ(message->bytes, std::string("a page"));
  char* page = message->fd >= 0 ? MapPage(message->fd) : nullptr;
  if (message->fd >= 0) close(message->fd);
  CHECK(page != nullptr);
  if (page != nullptr) {
    CHECK_EQ(std::string(page), std::string("from process 0"));
    std::strcpy(page, "from process 1");
  }
  CHECK(SendLink(KnownLinkPeer(0), "answered", "").success());
  return true;
}

// Process `process`'s part in a swap of 8-byte blocks between device 0 of
// process 0 and device 0 of process 1, whose payload is `payload`.
ffi::Error Swap(int process, const std::string& payload) {
  PermuteRoute route;
  route.size = 2;
  route.self = process;
  route.source = route.destination = 1 - process;
  route.devices = {0, 0};
  route.sources = {1, 0};
  ProcessPlan where;
  where.process = process;
  where.processes = {0, 1};
  where.links.resize(2);
  where.links[process] = std::string(LinkSelf().name);
  where.links[1 - process] = std::string(KnownLinkPeer(1 - process).name);
  where.site = "test_ppermute_host.cc";
  where.timeout = milliseconds(10000);
  std::vector<std::string> got;
  return ExchangeAtSite(
      route, where, 8, {1 - process},
      [&](int, const std::string&, std::string* out) {
        *out = payload;
        return ffi::Error::Success();
      },
      {1 - process}, 8, "the block", &got);
}

// Process 1: takes the page (TakePage), aborts a call, sends a block of the
// wrong size, then exits.
int Child(const std::string& parent_name, const std::string& own_name) {
  CHECK(KnowLinkPeer(LinkPeer{0, parent_name}, getppid()).success());
  SetLinkHandlers(TakePage, nullptr);
  CHECK(ListenLink(LinkPeer{1, own_name}, milliseconds(10000)).success());
  const LinkPeer parent = KnownLinkPeer(0);
  CHECK_EQ(std::string(parent.name), parent_name);
  // The parent listens once it has forked this process: until then it is
  // refused as gone.
  ffi::Error err = SendLink(parent, "ready", "");
  for (int i = 0; i < 500 && err.failure(); ++i) {
    usleep(10000);
    err = SendLink(parent, "ready", "");
  }
  CHECK(err.success());
  AbortLink(parent, "abort:call 7", "its block was lost");
  (void)Swap(1, "abc");
  // Wait until the parent is done with this process, then exit: the
  // parent's next wait finds it gone.
  std::string got;
  CHECK(ReceiveLink(parent, "bye", "abort:bye", "bye", milliseconds(60000), &got).success());
  return ::jax_tma::testing::FailureCount();
}

// ---- the wire format, spoken by hand ----

struct WireHeader {  // peer_link.cc's Header, as it travels
  uint32_t magic = 0x6a746d61;
  uint32_t kind = 0;
  int32_t process = -1;
  uint32_t key_size = 0;
  uint64_t size = 0;
};
constexpr uint32_t kHello = 1, kData = 2, kAbort = 3;

// A header alone, with sizes that need not match what follows.
std::string Header(uint32_t kind, int process, uint32_t key_size, uint64_t size,
                   uint32_t magic = WireHeader().magic) {
  const WireHeader h{magic, kind, process, key_size, size};
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

// A whole message.
std::string Wire(uint32_t kind, int process, const std::string& key = "",
                 const std::string& bytes = "") {
  return Header(kind, process, static_cast<uint32_t>(key.size()), bytes.size()) + key + bytes;
}

constexpr uid_t kSameUid = static_cast<uid_t>(-1);
constexpr uid_t kNobody = 65534;

struct Raw {
  std::string bytes;           // sent at once
  int fd = -1;                 // sent `copies` times with byte `fd_at`, unless -1
  int copies = 1;
  uid_t uid = kSameUid;        // the uid (and gid) to connect as
  bool wait_for_close = true;  // else it closes its end after sending
  size_t fd_at = 0;
};

// Forks a process that connects to @name as `raw` says, sends its bytes and,
// unless told otherwise, keeps the connection until the other side closes
// it; returns its pid. It does only system calls between fork and _exit.
pid_t RawPeer(const std::string& name, const Raw& raw) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  const pid_t pid = fork();
  if (pid != 0) return pid;
  if (raw.uid != kSameUid && (setgid(raw.uid) != 0 || setuid(raw.uid) != 0)) _exit(2);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&addr), size) != 0) _exit(3);
  // Bytes before the descriptor's go first, on their own.
  const size_t at = raw.fd >= 0 ? raw.fd_at : 0;
  if (at > 0 && send(fd, raw.bytes.data(), at, MSG_NOSIGNAL) != static_cast<ssize_t>(at)) _exit(4);
  if (raw.bytes.size() > at) {
    iovec iov{const_cast<char*>(raw.bytes.data() + at), 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (raw.fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(raw.copies * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(raw.copies * sizeof(int));
      for (int i = 0; i < raw.copies; ++i) {
        std::memcpy(CMSG_DATA(c) + i * sizeof(int), &raw.fd, sizeof(int));
      }
    }
    // The other side may have closed already (a refusal): no error counts.
    if (sendmsg(fd, &msg, MSG_NOSIGNAL) == 1) {
      (void)send(fd, raw.bytes.data() + at + 1, raw.bytes.size() - at - 1, MSG_NOSIGNAL);
    }
  }
  if (raw.wait_for_close) {
    char c;
    while (read(fd, &c, 1) > 0) {
    }
  }
  _exit(0);
}

// The next refusal the link records, waiting up to 10 s ("" if none came).
std::deque<std::string> pending_refusals;
std::string NextRefusal() {
  for (int i = 0; i < 1000 && pending_refusals.empty(); ++i) {
    for (std::string& line : TakeLinkRefusals()) pending_refusals.push_back(std::move(line));
    if (pending_refusals.empty()) usleep(10000);
  }
  if (pending_refusals.empty()) return "";
  std::string line = std::move(pending_refusals.front());
  pending_refusals.pop_front();
  return line;
}

// Whether a process holds an open descriptor whose target names `part`.
bool HoldsDescriptor(pid_t pid, const std::string& part) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd/";
  for (int fd = 0; fd < 4096; ++fd) {
    char target[256];
    const ssize_t n = readlink((dir + std::to_string(fd)).c_str(), target, sizeof(target) - 1);
    if (n > 0 && Has(std::string(target, static_cast<size_t>(n)), part)) return true;
  }
  return false;
}

// `raw` from a process the parent knows as process `index` (or none, if
// `index` < 0) is refused or cut off with a record that says `what` (with
// its pid and uid), and nothing else changes: no process is gone, no abort
// or message is filed.
void ExpectRefused(const std::string& own_name, int index, Raw raw, const std::string& what,
                   const std::string& kind = "refused a connection") {
  const int memfd = raw.fd;
  const pid_t pid = RawPeer(own_name, raw);
  if (memfd >= 0) close(memfd);  // the raw peer holds its own copy
  if (index >= 0) {
    CHECK(KnowLinkPeer(LinkPeer{index, "unused." + std::to_string(index)}, pid).success());
  }
  const std::string line = NextRefusal();
  const uid_t uid = raw.uid == kSameUid ? geteuid() : raw.uid;
  const std::string who = "(pid " + std::to_string(pid) + ", uid " + std::to_string(uid) + ")";
  if (!(Has(line, "the jax_tma process link " + kind + " " + who + ": ") && Has(line, what))) {
    ::jax_tma::testing::Fail(__FILE__, __LINE__,
                             "refusal '" + line + "' lacks '" + kind + " " + who + "' or '" +
                                 what + "'");
  }
  int status = -1;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (index >= 0) {
    std::chrono::steady_clock::duration took;
    ffi::Error err = TimedReceive(LinkPeer{index, {}}, "forged", "a forged message",
                                  milliseconds(50), &took);
    CHECK(FailedWith(err, ffi::ErrorCode::kDeadlineExceeded, "timed out"));
  }
  CHECK(LinkAbortReason("forged").empty());
  CHECK(!HoldsDescriptor(getpid(), "jax_tma_test_intruder"));
}

int IntruderMemfd() {
  const int fd = memfd_create("jax_tma_test_intruder", 0);
  CHECK(fd >= 0);
  return fd;
}

// Every refusal of a connection into this process (whose name is
// `own_name`; process 1 is `child`).
void RefusesIntruders(const std::string& own_name, pid_t child) {
  // The eventfd that wakes Python's logging thread.
  const int signal = LinkRefusalSignal();
  CHECK(signal >= 0);
  const pid_t unknown = RawPeer(own_name, Raw{Wire(kHello, 1), -1, 1, kSameUid, false});
  pollfd p{signal, POLLIN, 0};
  CHECK(poll(&p, 1, 10000) == 1);
  uint64_t count = 0;
  CHECK(read(signal, &count, sizeof(count)) == static_cast<ssize_t>(sizeof(count)));
  CHECK(Has(NextRefusal(), "refused a connection (pid " + std::to_string(unknown) + ", uid " +
                               std::to_string(geteuid()) + "): pid " + std::to_string(unknown) +
                               " is not a process of this job"));
  waitpid(unknown, nullptr, 0);

  // Unknown pids: one that hung up is refused at once, one that stays
  // waits out the bound (ListenLink's 0.5 s) unread.
  ExpectRefused(own_name, -1, Raw{Wire(kAbort, 1, "forged", "stop"), -1, 1, kSameUid, false},
                "is not a process of this job");
  ExpectRefused(own_name, -1, Raw{}, "is not a process of this job (none of the");
  ExpectRefused(own_name, -1, Raw{Wire(kHello, 1) + Wire(kData, 1, "forged", "x"),
                                  IntruderMemfd(), 1, kSameUid, false},
                "is not a process of this job");
  if (geteuid() == 0) {
    ExpectRefused(own_name, -1, Raw{Wire(kHello, 1), -1, 1, kNobody},
                  "uid 65534 is not this process's uid 0");
  } else {
    std::printf("test_ppermute_host: not root, so no process of another uid is tried\n");
  }

  // Known pids with false or broken hellos.
  ExpectRefused(own_name, 10, Raw{Wire(kHello, 40)},
                "it claims to be process 40, which has published no pid here");
  ExpectRefused(own_name, 11, Raw{Wire(kHello, 1)},
                "it claims to be process 1, whose pid is " + std::to_string(child));
  ExpectRefused(own_name, 12, Raw{Wire(kData, 12, "forged", "x")},
                "its first message is no hello (magic 1786015073, kind 2, a 6-byte key, 1 bytes)");
  ExpectRefused(own_name, 13, Raw{Header(kHello, 13, 0, uint64_t{1} << 63)},
                "its first message is no hello (magic 1786015073, kind 1, a 0-byte key, "
                "9223372036854775808 bytes)");
  ExpectRefused(own_name, 14, Raw{Wire(kHello, 14), IntruderMemfd()},
                "its first message is no hello (magic 1786015073, kind 1, a 0-byte key, 0 bytes, "
                "a descriptor)");
  ExpectRefused(own_name, 15, Raw{Wire(kHello, 15), IntruderMemfd(), 3},
                "3 descriptors came with one message (at most 1)");
  ExpectRefused(own_name, 16, Raw{Header(kHello, 16, 0, 0, 0x12345678)},
                "its first message is no hello (magic 305419896");

  // Authenticated, then broken: cut off without being marked gone.
  auto cut_off = [&](int index, const std::string& after_hello, const std::string& what,
                     int fd = -1, int copies = 1) {
    ExpectRefused(own_name, index,
                  Raw{Wire(kHello, index) + after_hello, fd, copies, kSameUid, true,
                      sizeof(WireHeader)},
                  what, "closed the connection of process " + std::to_string(index));
  };
  cut_off(20, Header(kData, 20, 0, 0, 7), "a header's magic is 7, not 1786015073");
  cut_off(21, Wire(kHello, 21), "a second hello");
  cut_off(22, Wire(7, 22), "a message of unknown kind 7");
  cut_off(23, Wire(kAbort, 1, "forged", "stop"),
          "a message claims to come from process 1 on the connection of process 23");
  cut_off(24, Header(kData, 24, 1u << 20, 0), "a key of 1048576 bytes (at most 65536)");
  cut_off(25, Header(kData, 25, 6, uint64_t{1} << 63) + "forged",
          "a message of 9223372036854775808 bytes, more than this host's memory (");
  cut_off(26, Header(kAbort, 26, 6, 1u << 21) + "forged",
          "an abort of 2097152 bytes (at most 1048576)");
  cut_off(27, Wire(kAbort, 27, "forged", "stop"), "a descriptor came with an abort",
          IntruderMemfd());
  // This process has no message handler: no message takes a descriptor.
  cut_off(28, Wire(kData, 28, "forged", "x"),
          "a descriptor came with message 'forged', which takes none", IntruderMemfd());
  cut_off(29, Wire(kData, 29, "forged", "x"), "2 descriptors came with one message (at most 1)",
          IntruderMemfd(), 2);

  // A peer may connect before this process knows its pid: its connection
  // waits, unread, and is let in once the pid is known.
  const pid_t early = RawPeer(own_name, Raw{Wire(kHello, 30) + Wire(kData, 30, "early", "in")});
  usleep(200000);
  CHECK(KnowLinkPeer(LinkPeer{30, "unused.30"}, early).success());
  std::string got;
  CHECK(ReceiveLink(LinkPeer{30, {}}, "early", "abort:early", "the early message",
                    milliseconds(10000), &got)
            .success());
  CHECK_EQ(got, std::string("in"));

  // Every refusal was recorded once: none is left.
  CHECK_EQ(TakeLinkRefusals().size() + pending_refusals.size(), size_t{0});
  kill(early, SIGKILL);
  waitpid(early, nullptr, 0);
}

// What this process tells the link about its peers, and whom it connects to.
void ChecksWhomItReaches(const std::string& own_name, pid_t child) {
  CHECK(FailedWith(KnowLinkPeer(LinkPeer{1, "another name"}, child),
                   ffi::ErrorCode::kFailedPrecondition,
                   "process 1 is known as pid " + std::to_string(child) + " on @"));
  CHECK(FailedWith(KnowLinkPeer(LinkPeer{1, Name(1)}, child + 1),
                   ffi::ErrorCode::kFailedPrecondition, ", not as pid "));
  CHECK(FailedWith(KnowLinkPeer(LinkPeer{3, "x"}, 0), ffi::ErrorCode::kInvalidArgument,
                   "process 3 published pid 0, which no process can have"));
  CHECK(FailedWith(KnowLinkPeer(LinkPeer{3, "x"}, 1ll << 40), ffi::ErrorCode::kInvalidArgument,
                   "which no process can have"));
  CHECK(FailedWith(SendLink(LinkPeer{60, "x"}, "k", ""), ffi::ErrorCode::kFailedPrecondition,
                   "the link does not know process 60's pid"));

  // Another process listens on a known peer's name (here: this one, in the
  // child's stead): it is sent nothing, and the peer counts as gone.
  const std::string name = own_name + ".impostor";
  const int impostor = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  CHECK(bind(impostor, reinterpret_cast<const sockaddr*>(&addr), size) == 0 &&
        listen(impostor, 4) == 0);
  CHECK(KnowLinkPeer(LinkPeer{50, name}, child).success());
  const ffi::Error err = SendLink(LinkPeer{50, name}, "k", "secret");
  CHECK(FailedWith(err, ffi::ErrorCode::kUnavailable,
                   "process 50 is gone (@" + name + ": pid " + std::to_string(getpid()) +
                       " (uid " + std::to_string(geteuid()) + ") listens there, not its pid " +
                       std::to_string(child) + " (uid " + std::to_string(geteuid()) +
                       "): it exited and another process took its name)"));
  CHECK(Has(NextRefusal(), "the jax_tma process link sent nothing to @" + name +
                               ", process 50's name (pid " + std::to_string(getpid()) +
                               ", uid " + std::to_string(geteuid()) + "): pid "));
  const int accepted = accept(impostor, nullptr, nullptr);
  char c;
  CHECK(accepted >= 0 && read(accepted, &c, 1) == 0);  // not even a hello
  close(accepted);
  close(impostor);
}

// A GPU region offer is checked before the driver sees its descriptor.
void ChecksRegionOffers() {
  unsigned long long id = 0;
  CHECK(IsRegionOfferKey("jax_tma/region/5", &id) && id == 5);
  CHECK(!IsRegionOfferKey("jax_tma/region/5/at", &id));
  CHECK(!IsRegionOfferKey("jax_tma/region/", &id));
  CHECK(!IsRegionOfferKey("jax_tma/region/x", &id));
  CHECK(!IsRegionOfferKey("jax_tma/region/123456789012345678901", &id));
  CHECK(!IsRegionOfferKey("block#1", &id));
  CHECK_EQ(RegionOfferKey(5), std::string("jax_tma/region/5"));
  auto bytes = [](unsigned long long offer_id, unsigned long long size) {
    const RegionOffer offer{offer_id, size};
    return std::string(reinterpret_cast<const char*>(&offer), sizeof(offer));
  };
  RegionOffer offer;
  const int null_device = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int memfd = IntruderMemfd();
  int pipe_fds[2];
  CHECK(pipe(pipe_fds) == 0);
  CHECK_EQ(CheckRegionOffer(5, "abc", null_device, &offer),
           std::string("an offer of 3 bytes (a region offer has 16)"));
  CHECK_EQ(CheckRegionOffer(5, bytes(6, 4096), null_device, &offer),
           std::string("the offer names allocation 6 under the key of allocation 5"));
  CHECK_EQ(CheckRegionOffer(5, bytes(5, 0), null_device, &offer),
           std::string("an offer of an allocation of 0 bytes"));
  CHECK_EQ(CheckRegionOffer(5, bytes(5, 4096), -1, &offer),
           std::string("no descriptor came with the offer"));
  CHECK_EQ(CheckRegionOffer(5, bytes(5, 4096), memfd, &offer),
           std::string("the offered descriptor is a regular file, not the GPU driver's character "
                       "device"));
  CHECK_EQ(CheckRegionOffer(5, bytes(5, 4096), pipe_fds[0], &offer),
           std::string("the offered descriptor is a pipe, not the GPU driver's character device"));
  // A character device passes; the driver refuses one that is not its own.
  CHECK_EQ(CheckRegionOffer(5, bytes(5, 4096), null_device, &offer), std::string());
  CHECK(offer.id == 5 && offer.size == 4096);
  for (int fd : {null_device, memfd, pipe_fds[0], pipe_fds[1]}) close(fd);
}

void Parent(pid_t child, const std::string& own_name, const std::string& child_name) {
  const LinkPeer self{0, own_name};
  // The child may connect as soon as this process listens: it is known first.
  CHECK(KnowLinkPeer(LinkPeer{1, child_name}, child).success());
  // A second name for this process is refused; the same one is not.
  CHECK(ListenLink(self, milliseconds(500)).success());
  const ffi::Error twice = ListenLink(LinkPeer{0, own_name + ".other"}, milliseconds(500));
  CHECK(FailedWith(twice, ffi::ErrorCode::kFailedPrecondition, "already listens as process 0"));
  const LinkPeer peer = KnownLinkPeer(1);
  CHECK_EQ(std::string(peer.name), child_name);
  CHECK(KnownLinkPeer(7).name.empty());

  // To itself: straight into its own inbox, bytes only.
  std::string got;
  CHECK(SendLink(self, "note", "to myself").success());
  CHECK(ReceiveLink(self, "note", "abort:note", "a note", milliseconds(100), &got).success());
  CHECK_EQ(got, std::string("to myself"));
  CHECK(FailedWith(SendLink(self, "note", "", 0), ffi::ErrorCode::kInvalidArgument,
                   "a descriptor cannot go to this process itself (key 'note')"));

  // A page of shared memory, passed as a descriptor to the child's handler,
  // once the child listens (until then it is refused as gone).
  ffi::Error ready = ReceiveLink(peer, "ready", "abort:ready", "ready", milliseconds(10000), &got);
  for (int i = 0; i < 500 && ready.failure() && *ready.errc() == ffi::ErrorCode::kUnavailable;
       ++i) {
    usleep(10000);
    ready = ReceiveLink(peer, "ready", "abort:ready", "ready", milliseconds(10000), &got);
  }
  CHECK(ready.success());
  const int fd = memfd_create("jax_tma_test_ppermute_host", MFD_CLOEXEC);
  CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
  char* page = MapPage(fd);
  CHECK(page != nullptr);
  if (page == nullptr) return;
  std::strcpy(page, "from process 0");
  CHECK(SendLink(peer, "page", "a page", fd).success());
  close(fd);
  CHECK(ReceiveLink(peer, "answered", "abort:answered", "the answer", milliseconds(10000), &got)
            .success());
  CHECK_EQ(std::string(page), std::string("from process 1"));

  // An abort under the awaited call's key ends the wait with its reason.
  ffi::Error err = ReceiveLink(peer, "block of call 7", "abort:call 7", "the block of call 7",
                               milliseconds(10000), &got);
  CHECK(FailedWith(err, ffi::ErrorCode::kAborted,
                   "while this process waited for the block of call 7, process 1: its block was "
                   "lost"));

  // Nothing comes: the wait ends at its timeout.
  std::chrono::steady_clock::duration took;
  err = TimedReceive(peer, "never", "a message that never comes", milliseconds(200), &took);
  CHECK(FailedWith(err, ffi::ErrorCode::kDeadlineExceeded,
                   "s waiting for a message that never comes from process 1; it never made this "
                   "call"));
  CHECK(took >= milliseconds(200));

  // A payload of another size than the call takes fails the meeting.
  CHECK(FailedWith(Swap(0, "8 bytes."), ffi::ErrorCode::kFailedPrecondition,
                   "jax_tma.ppermute at test_ppermute_host.cc, call 0 on device 0 of process 0: "
                   "device 0 of process 1 sent the block of 3 bytes where this call takes 8"));

  RefusesIntruders(own_name, child);
  ChecksWhomItReaches(own_name, child);
  ChecksRegionOffers();

  // The peer exits: a wait on it ends at once, long before its timeout.
  CHECK(SendLink(peer, "bye", "").success());
  int status = -1;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  err = TimedReceive(peer, "after exit", "a message after its exit", milliseconds(60000), &took);
  CHECK(FailedWith(err, ffi::ErrorCode::kUnavailable,
                   "process 1 is gone (its connection closed) while this process waited for a "
                   "message after its exit"));
  CHECK(took < std::chrono::seconds(5));

  // A name nothing listens on.
  const std::string nobody_name = own_name + ".nobody";
  const LinkPeer nobody{2, nobody_name};
  CHECK(FailedWith(SendLink(nobody, "x", ""), ffi::ErrorCode::kFailedPrecondition,
                   "the link does not know process 2's pid"));
  CHECK(KnowLinkPeer(nobody, child).success());
  err = SendLink(nobody, "x", "");
  CHECK(FailedWith(err, ffi::ErrorCode::kUnavailable, "process 2 is gone (nothing listens on @"));
  munmap(page, 4096);
}

}  // namespace
}  // namespace jax_tma

int main() {
  const std::string parent_name = jax_tma::Name(0), child_name = jax_tma::Name(1);
  const pid_t child = fork();
  if (child == 0) _exit(jax_tma::Child(parent_name, child_name) == 0 ? 0 : 1);
  jax_tma::Parent(child, parent_name, child_name);
  return jax_tma::testing::Failures("test_ppermute_host");
}
