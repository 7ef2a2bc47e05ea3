// The process link of the peer transport (see the header). One listener thread
// accepts the peers' connections and one reader thread per connection files
// what arrives into an inbox; senders keep one connection per peer, which
// also tells a waiting receiver when that peer has gone.
//
// Wire format, per message: a Header (sent with the descriptor, if any, as
// SCM_RIGHTS ancillary data), then the key, then the bytes. The first
// message on a connection is a hello that names the sending process; the
// reader reads it only once the connection's SO_PEERCRED pid is that of a
// process KnowLinkPeer told, and every later header must name the same one.
#include "peer/peer_link.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

namespace jax_tma {
namespace {

constexpr uint32_t kMagic = 0x6a746d61;  // "jtma"
// How often a waiting receiver looks at its connection to the sender.
constexpr std::chrono::milliseconds kPollEvery{20};
// A key names a call site (a source file path, at most PATH_MAX) and a few
// numbers; an abort carries one error message.
constexpr uint32_t kMaxKeySize = 1 << 16;
constexpr uint64_t kMaxAbortSize = 1 << 20;
// Refusals kept for Python to log; past that they are only counted (a flood
// of connections must not grow this process without bound).
constexpr size_t kMaxRefusals = 1000;

enum class Kind : uint32_t { kHello = 1, kData = 2, kAbort = 3 };

struct Header {
  uint32_t magic = kMagic;
  Kind kind = Kind::kData;
  int32_t process = -1;  // the sender
  uint32_t key_size = 0;
  uint64_t size = 0;
};

using InboxKey = std::pair<int, std::string>;  // (sender, key)

struct Link {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> self{-1};  // written once, under mu
  std::string name;
  // How long a connection from a pid not (yet) known waits for KnowLinkPeer.
  std::chrono::milliseconds unknown_wait{0};
  struct Peer {
    pid_t pid = 0;
    std::string name;
  };
  std::map<int, Peer> peers;                 // by process index: never erased or changed
  std::map<InboxKey, std::string> inbox;
  std::map<std::string, std::string> aborted;  // abort key -> why (from any process)
  std::set<int> gone;                       // peers whose connection closed
  struct Out {
    std::mutex mu;  // one message at a time on the connection
    int fd = -1;
  };
  std::map<int, std::unique_ptr<Out>> out;  // connection to each peer
  std::atomic<LinkHandler> on_message{nullptr};
  std::atomic<LinkGoneHandler> on_gone{nullptr};
};

Link& TheLink() {
  static auto* link = new Link();  // outlives the threads that use it
  return *link;
}

ffi::Error LinkError(ffi::ErrorCode code, const Message& m) { return ffi::Error(code, m.str()); }

std::string Errno() { return std::strerror(errno); }

// ---- refusals ----

struct Refusals {
  std::mutex mu;
  std::deque<std::string> lines;
  size_t dropped = 0;  // past kMaxRefusals
  int signal = eventfd(0, EFD_CLOEXEC);
};

Refusals& TheRefusals() {
  static auto* refusals = new Refusals();  // outlives the threads that use it
  return *refusals;
}

// Records what the link refused, with the other side's credentials, and
// wakes the Python thread that logs it.
void Refuse(const ucred& peer, std::string_view what, std::string_view why) {
  Refusals& r = TheRefusals();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.lines.size() < kMaxRefusals) {
      r.lines.push_back((Message() << "the jax_tma process link " << what << " (pid " << peer.pid
                                   << ", uid " << peer.uid << "): " << why)
                            .str());
    } else {
      ++r.dropped;
    }
  }
  const uint64_t one = 1;
  // Fails only once 2^64 - 2 wakeups are unread: the reader wakes anyway.
  const ssize_t written = r.signal >= 0 ? write(r.signal, &one, sizeof(one)) : 0;
  (void)written;
}

// ---- sockets ----

sockaddr_un Address(std::string_view name, socklen_t* size) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file to clean up.
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  *size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

// The process at the other end of a connected socket, as the kernel saw it
// connect (or listen).
bool Credentials(int fd, ucred* out, std::string* why) {
  socklen_t size = sizeof(*out);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, out, &size) == 0) return true;
  *why = "getsockopt(SO_PEERCRED): " + Errno();
  *out = ucred{0, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
  return false;
}

bool ReadAll(int fd, void* data, size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool WriteAll(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Reads one header and the descriptor sent with it (-1: none). False when
// the connection closed (or broke) first. `why` says what was wrong with
// the descriptors that came with it; they are closed then.
bool ReadHeader(int fd, Header* h, int* passed, std::string* why) {
  *passed = -1;
  iovec iov{h, sizeof(*h)};
  // Room for a few descriptors, so that extra ones are closed here rather
  // than truncated away unseen.
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int passed_fd;
        std::memcpy(&passed_fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(passed_fd);
      }
    }
  }
  if (fds.size() > 1 || (msg.msg_flags & MSG_CTRUNC) != 0) {
    for (int f : fds) close(f);
    *why = (Message() << fds.size() << ((msg.msg_flags & MSG_CTRUNC) != 0 ? " or more" : "")
                      << " descriptors came with one message (at most 1)")
               .str();
  } else if (!fds.empty()) {
    *passed = fds[0];
  }
  // The descriptor comes with the header's first byte; the rest may follow.
  if (!ReadAll(fd, reinterpret_cast<char*>(h) + n, sizeof(*h) - static_cast<size_t>(n))) {
    if (*passed >= 0) close(*passed);
    *passed = -1;
    return false;
  }
  return true;
}

// The largest data message this host could hold: its memory.
uint64_t MaxDataSize() {
  static const uint64_t size = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                               static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// What breaks the wire format in a header after the hello on the
// connection of process `sender`; empty if nothing does.
std::string Malformed(const Header& h, int sender, int passed) {
  Message m;
  if (h.magic != kMagic) {
    m << "a header's magic is " << h.magic << ", not " << kMagic;
  } else if (h.kind == Kind::kHello) {
    m << "a second hello";
  } else if (h.kind != Kind::kData && h.kind != Kind::kAbort) {
    m << "a message of unknown kind " << static_cast<uint32_t>(h.kind);
  } else if (h.process != sender) {
    m << "a message claims to come from process " << h.process
      << " on the connection of process " << sender;
  } else if (h.key_size > kMaxKeySize) {
    m << "a key of " << h.key_size << " bytes (at most " << kMaxKeySize << ")";
  } else if (h.kind == Kind::kData && h.size > MaxDataSize()) {
    m << "a message of " << h.size << " bytes, more than this host's memory ("
      << MaxDataSize() << " bytes)";
  } else if (h.kind == Kind::kAbort && h.size > kMaxAbortSize) {
    m << "an abort of " << h.size << " bytes (at most " << kMaxAbortSize << ")";
  } else if (h.kind == Kind::kAbort && passed >= 0) {
    m << "a descriptor came with an abort";
  }
  return m.str();
}

// Whether the other end of a connection has closed it (or shut it down).
bool HungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

bool KnownPid(const Link& link, pid_t pid) {
  return std::any_of(link.peers.begin(), link.peers.end(),
                     [pid](const auto& p) { return p.second.pid == pid; });
}

// The process that the connection `fd` from `peer` is, or -1 and why it is
// refused. Nothing is read until `peer.pid` is a known process's pid (a peer
// may connect before this process has read its entry in the key-value
// store); then the hello must name that very process.
int Authenticate(int fd, const ucred& peer, std::string* why) {
  Link& link = TheLink();
  if (peer.pid == 0) {
    *why = "its pid is hidden from this process (it runs in another pid namespace; the "
           "processes of a job must see each other's pids)";
    return -1;
  }
  {
    std::unique_lock<std::mutex> lock(link.mu);
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + link.unknown_wait;
    while (!KnownPid(link, peer.pid)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline || HungUp(fd)) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
        *why = (Message() << "pid " << peer.pid << " is not a process of this job (none of the "
                          << link.peers.size() << " processes known here published it; waited "
                          << waited.count() / 1000.0 << " s)")
                   .str();
        return -1;
      }
      link.cv.wait_for(lock, std::min<std::chrono::steady_clock::duration>(kPollEvery,
                                                                            deadline - now));
    }
  }
  Header h;
  int passed;
  if (!ReadHeader(fd, &h, &passed, why)) {
    if (why->empty()) *why = "it closed the connection before its hello";
    return -1;
  }
  const bool with_fd = passed >= 0;
  if (with_fd) close(passed);
  if (!why->empty()) return -1;
  if (h.magic != kMagic || h.kind != Kind::kHello || h.key_size != 0 || h.size != 0 || with_fd) {
    *why = (Message() << "its first message is no hello (magic " << h.magic << ", kind "
                      << static_cast<uint32_t>(h.kind) << ", a " << h.key_size << "-byte key, "
                      << h.size << " bytes" << (with_fd ? ", a descriptor" : "") << ")")
               .str();
    return -1;
  }
  std::lock_guard<std::mutex> lock(link.mu);
  auto it = link.peers.find(h.process);
  if (it == link.peers.end() || it->second.pid != peer.pid) {
    Message m;
    m << "it claims to be process " << h.process << ", ";
    if (it == link.peers.end()) {
      m << "which has published no pid here";
    } else {
      m << "whose pid is " << it->second.pid;
    }
    *why = m.str();
    return -1;
  }
  return h.process;
}

// Reads the key and bytes of a message with header `h`; false when the
// connection closed first, or (with `why`) when the bytes cannot be held.
bool ReadBody(int fd, const Header& h, std::string* key, std::string* bytes, std::string* why) {
  try {
    key->resize(h.key_size);
    bytes->resize(h.size);
  } catch (const std::bad_alloc&) {  // a detached thread must not throw
    *why = (Message() << "no memory for a message of " << h.size << " bytes").str();
    return false;
  }
  return ReadAll(fd, key->data(), key->size()) && ReadAll(fd, bytes->data(), bytes->size());
}

// Files every message of one incoming connection from `peer`, once it has
// authenticated; marks its sender gone when it closes. A connection that is
// refused or breaks the wire format is closed and changes nothing else.
void ReadConnection(int fd, ucred peer) {
  Link& link = TheLink();
  std::string why;
  const int sender = Authenticate(fd, peer, &why);
  if (sender < 0) {
    close(fd);
    Refuse(peer, "refused a connection", why);
    return;
  }
  for (;;) {
    Header h;
    int passed;
    if (!ReadHeader(fd, &h, &passed, &why)) break;
    if (why.empty()) why = Malformed(h, sender, passed);
    std::string key, bytes;
    if (!why.empty() || !ReadBody(fd, h, &key, &bytes, &why)) {
      if (passed >= 0) close(passed);
      break;
    }
    if (h.kind == Kind::kData) {
      LinkMessage message{std::move(bytes), passed};
      const LinkHandler handle = link.on_message.load();
      if (handle != nullptr && handle(sender, key, &message)) continue;
      if (message.fd >= 0) {
        close(message.fd);
        why = "a descriptor came with message '" + key.substr(0, 200) +
              "', which takes none";
        break;
      }
      bytes = std::move(message.bytes);
    }
    std::lock_guard<std::mutex> lock(link.mu);
    if (h.kind == Kind::kData) {
      link.inbox[{sender, std::move(key)}] = std::move(bytes);
    } else {
      link.aborted.emplace(std::move(key), "process " + std::to_string(sender) + ": " + bytes);
    }
    link.cv.notify_all();
  }
  close(fd);
  if (!why.empty()) {
    Refuse(peer, "closed the connection of process " + std::to_string(sender), why);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(link.mu);
    link.gone.insert(sender);
    link.cv.notify_all();
  }
  const LinkGoneHandler gone = link.on_gone.load();
  if (gone != nullptr) gone(sender);
}

void Accept(int listener) {
  const uid_t uid = geteuid();
  for (;;) {
    int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    // Another user's connection costs no thread.
    ucred peer;
    std::string why;
    if (!Credentials(fd, &peer, &why) || peer.uid != uid) {
      close(fd);
      if (why.empty()) {
        why = (Message() << "uid " << peer.uid << " is not this process's uid " << uid).str();
      }
      Refuse(peer, "refused a connection", why);
      continue;
    }
    try {
      std::thread(ReadConnection, fd, peer).detach();
    } catch (const std::system_error& e) {  // no thread to spare: this thread must go on
      close(fd);
      Refuse(peer, "refused a connection", std::string("no thread to read it: ") + e.what());
    }
  }
}

bool SendMessage(int fd, Kind kind, int self, std::string_view key, std::string_view bytes,
                 int passed) {
  Header h;
  h.kind = kind;
  h.process = self;
  h.key_size = static_cast<uint32_t>(key.size());
  h.size = bytes.size();
  iovec iov{&h, sizeof(h)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (passed >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &passed, sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  return WriteAll(fd, reinterpret_cast<const char*>(&h) + n, sizeof(h) - static_cast<size_t>(n)) &&
         WriteAll(fd, key.data(), key.size()) && WriteAll(fd, bytes.data(), bytes.size());
}

// The connection to `to`, made with its hello on first use. A peer lists
// its name only once it listens, so a refused connection means it is gone;
// so does another process listening there (the name is free again once its
// owner exited), which gets nothing from this one.
ffi::Error Connect(const LinkPeer& to, Link::Out** out) {
  Link& link = TheLink();
  pid_t pid;
  {
    std::lock_guard<std::mutex> lock(link.mu);
    if (link.self < 0) {
      return LinkError(ffi::ErrorCode::kFailedPrecondition,
                       Message() << "this process has no link (ListenLink first)");
    }
    auto known = link.peers.find(to.process);
    if (known == link.peers.end()) {
      return LinkError(ffi::ErrorCode::kFailedPrecondition,
                       Message() << "the link does not know process " << to.process
                                 << "'s pid (jax_tma reads it with the link name from "
                                 << "jax.distributed's key-value store when it lowers the "
                                 << "call), so it cannot check who listens on @" << to.name);
    }
    pid = known->second.pid;
    auto& slot = link.out[to.process];
    if (slot == nullptr) slot = std::make_unique<Link::Out>();
    *out = slot.get();
  }
  std::lock_guard<std::mutex> lock((*out)->mu);
  if ((*out)->fd >= 0) return ffi::Error::Success();
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return LinkError(ffi::ErrorCode::kInternal, Message() << "socket(): " << Errno());
  socklen_t size;
  const sockaddr_un addr = Address(to.name, &size);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), size) != 0) {
    const std::string why = Errno();
    close(fd);
    return LinkError(ffi::ErrorCode::kUnavailable,
                     Message() << "process " << to.process << " is gone (nothing listens on @"
                               << to.name << ": " << why << ")");
  }
  ucred listener;
  std::string why;
  if (!Credentials(fd, &listener, &why) || listener.pid != pid || listener.uid != geteuid()) {
    close(fd);
    if (why.empty()) {
      why = (Message() << "pid " << listener.pid << " (uid " << listener.uid
                       << ") listens there, not its pid " << pid << " (uid " << geteuid()
                       << "): it exited and another process took its name")
                .str();
    }
    Refuse(listener,
           (Message() << "sent nothing to @" << to.name << ", process " << to.process << "'s name")
               .str(),
           why);
    return LinkError(ffi::ErrorCode::kUnavailable,
                     Message() << "process " << to.process << " is gone (@" << to.name << ": "
                               << why << ")");
  }
  if (!SendMessage(fd, Kind::kHello, link.self, {}, {}, -1)) {
    why = Errno();
    close(fd);
    return LinkError(ffi::ErrorCode::kUnavailable,
                     Message() << "process " << to.process << " is gone (its hello on @"
                               << to.name << " failed: " << why << ")");
  }
  (*out)->fd = fd;
  return ffi::Error::Success();
}

}  // namespace

ffi::Error ListenLink(const LinkPeer& self, std::chrono::milliseconds timeout) {
  Link& link = TheLink();
  std::lock_guard<std::mutex> lock(link.mu);
  if (link.self >= 0) {
    if (link.self == self.process && link.name == self.name) {
      link.unknown_wait = std::max(link.unknown_wait, timeout);
      return ffi::Error::Success();
    }
    return LinkError(ffi::ErrorCode::kFailedPrecondition,
                     Message() << "this process already listens as process " << link.self.load()
                               << " (@" << link.name << "), not " << self.process << " (@"
                               << self.name << ")");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return LinkError(ffi::ErrorCode::kInternal, Message() << "socket(): " << Errno());
  socklen_t size;
  const sockaddr_un addr = Address(self.name, &size);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), size) != 0 || listen(fd, 64) != 0) {
    const std::string why = Errno();
    close(fd);
    return LinkError(ffi::ErrorCode::kInternal,
                     Message() << "cannot listen on abstract socket @" << self.name << ": "
                               << why);
  }
  link.self = self.process;
  link.name = std::string(self.name);
  link.unknown_wait = timeout;
  std::thread(Accept, fd).detach();
  return ffi::Error::Success();
}

ffi::Error KnowLinkPeer(const LinkPeer& peer, long long pid) {
  if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) {
    return LinkError(ffi::ErrorCode::kInvalidArgument,
                     Message() << "process " << peer.process << " published pid " << pid
                               << ", which no process can have");
  }
  Link& link = TheLink();
  std::lock_guard<std::mutex> lock(link.mu);
  auto [it, added] = link.peers.try_emplace(
      peer.process, Link::Peer{static_cast<pid_t>(pid), std::string(peer.name)});
  if (!added && (it->second.pid != pid || it->second.name != peer.name)) {
    return LinkError(ffi::ErrorCode::kFailedPrecondition,
                     Message() << "process " << peer.process << " is known as pid "
                               << it->second.pid << " on @" << it->second.name
                               << ", not as pid " << pid << " on @" << peer.name);
  }
  link.cv.notify_all();
  return ffi::Error::Success();
}

LinkPeer KnownLinkPeer(int process) {
  Link& link = TheLink();
  std::lock_guard<std::mutex> lock(link.mu);
  auto it = link.peers.find(process);
  // The entry is never changed or erased, so its name outlives the lock.
  return LinkPeer{process, it == link.peers.end() ? std::string_view() : it->second.name};
}

LinkPeer LinkSelf() {
  Link& link = TheLink();
  std::lock_guard<std::mutex> lock(link.mu);
  return LinkPeer{link.self, link.name};
}

void SetLinkHandlers(LinkHandler on_message, LinkGoneHandler on_gone) {
  TheLink().on_message = on_message;
  TheLink().on_gone = on_gone;
}

ffi::Error SendLink(const LinkPeer& to, std::string_view key, std::string_view bytes, int fd) {
  Link& link = TheLink();
  if (to.name.empty() || to.process == link.self) {  // to this process: straight into the inbox
    if (fd >= 0) {
      return LinkError(ffi::ErrorCode::kInvalidArgument,
                       Message() << "a descriptor cannot go to this process itself (key '"
                                 << key << "'): descriptors travel to other processes only");
    }
    std::lock_guard<std::mutex> lock(link.mu);
    link.inbox[{to.process, std::string(key)}] = std::string(bytes);
    link.cv.notify_all();
    return ffi::Error::Success();
  }
  Link::Out* out;
  JAX_TMA_RETURN_IF_FAILED(Connect(to, &out));
  std::lock_guard<std::mutex> lock(out->mu);
  if (!SendMessage(out->fd, Kind::kData, link.self, key, bytes, fd)) {
    return LinkError(ffi::ErrorCode::kUnavailable,
                     Message() << "process " << to.process << " is gone (sending to it failed: "
                               << Errno() << ")");
  }
  return ffi::Error::Success();
}

ffi::Error ReceiveLink(const LinkPeer& from, std::string_view key, std::string_view abort_key,
                       std::string_view what, std::chrono::milliseconds timeout,
                       std::string* out) {
  Link& link = TheLink();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  // Our own connection to the sender tells when it has gone, also where it
  // never connected to us.
  Link::Out* conn = nullptr;
  if (!from.name.empty() && from.process != link.self) {
    JAX_TMA_RETURN_IF_FAILED(Connect(from, &conn));
  }
  const InboxKey k{from.process, std::string(key)};
  const std::string abort(abort_key);
  std::unique_lock<std::mutex> lock(link.mu);
  for (;;) {
    if (auto it = link.inbox.find(k); it != link.inbox.end()) {
      *out = std::move(it->second);
      link.inbox.erase(it);
      return ffi::Error::Success();
    }
    if (auto it = link.aborted.find(abort); it != link.aborted.end()) {
      return LinkError(ffi::ErrorCode::kAborted,
                       Message() << "while this process waited for " << what << ", "
                                 << it->second);
    }
    bool gone = link.gone.count(from.process) > 0;
    if (!gone && conn != nullptr) {
      lock.unlock();
      {
        std::lock_guard<std::mutex> out_lock(conn->mu);
        gone = HungUp(conn->fd);
      }
      lock.lock();
      if (link.inbox.count(k) || link.aborted.count(abort)) continue;
    }
    if (gone) {
      return LinkError(ffi::ErrorCode::kUnavailable,
                       Message() << "process " << from.process << " is gone (its connection "
                                 << "closed) while this process waited for " << what);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
      return LinkError(ffi::ErrorCode::kDeadlineExceeded,
                       Message() << "timed out after " << waited.count() / 1000.0
                                 << " s waiting for " << what << " from process " << from.process
                                 << "; it never made this call, is stuck, or is making "
                                 << "another one");
    }
    link.cv.wait_for(lock, std::min<std::chrono::steady_clock::duration>(kPollEvery,
                                                                          deadline - now));
  }
}

void AbortLink(const LinkPeer& to, std::string_view abort_key, std::string_view why) {
  Link& link = TheLink();
  if (to.name.empty() || to.process == link.self) {
    std::lock_guard<std::mutex> lock(link.mu);
    link.aborted.emplace(std::string(abort_key),
                         "process " + std::to_string(to.process) + ": " + std::string(why));
    link.cv.notify_all();
    return;
  }
  Link::Out* out;
  if (Connect(to, &out).failure()) return;
  std::lock_guard<std::mutex> lock(out->mu);
  SendMessage(out->fd, Kind::kAbort, link.self, abort_key, why, -1);
}

std::string LinkAbortReason(std::string_view abort_key) {
  Link& link = TheLink();
  std::lock_guard<std::mutex> lock(link.mu);
  auto it = link.aborted.find(std::string(abort_key));
  return it == link.aborted.end() ? std::string() : it->second;
}

int LinkRefusalSignal() { return TheRefusals().signal; }

std::vector<std::string> TakeLinkRefusals() {
  Refusals& r = TheRefusals();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> lines(r.lines.begin(), r.lines.end());
  r.lines.clear();
  if (r.dropped > 0) {
    lines.push_back((Message() << "the jax_tma process link refused " << r.dropped
                               << " more connections, not recorded one by one (over "
                               << kMaxRefusals << " awaited logging)")
                        .str());
    r.dropped = 0;
  }
  return lines;
}

}  // namespace jax_tma
