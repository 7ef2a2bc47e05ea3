// The process link of jax_tma.ppermute (see the header). One listener thread
// accepts the peers' connections and one reader thread per connection files
// what arrives into an inbox; senders keep one connection per peer, which
// also tells a waiting receiver when that peer has gone.
//
// Wire format, per message: a Header (sent with the descriptor, if any, as
// SCM_RIGHTS ancillary data), then the key, then the bytes. The first
// message on a connection is a hello that names the sending process.
#include "ppermute/peer_link.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

namespace jax_tma {
namespace {

constexpr uint32_t kMagic = 0x6a746d61;  // "jtma"
// How often a waiting receiver looks at its connection to the sender.
constexpr std::chrono::milliseconds kPollEvery{20};

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
  std::map<InboxKey, LinkMessage> inbox;
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

sockaddr_un Address(std::string_view name, socklen_t* size) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file to clean up.
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  *size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
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

// Reads one header and the descriptor sent with it (-1: none).
bool ReadHeader(int fd, Header* h, int* passed) {
  *passed = -1;
  iovec iov{h, sizeof(*h)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
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
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(passed, CMSG_DATA(c), sizeof(int));
    }
  }
  // The descriptor comes with the header's first byte; the rest may follow.
  if (!ReadAll(fd, reinterpret_cast<char*>(h) + n, sizeof(*h) - static_cast<size_t>(n)) ||
      h->magic != kMagic) {
    if (*passed >= 0) close(*passed);
    return false;
  }
  return true;
}

// Files every message of one incoming connection; marks its sender gone
// when it closes (or breaks the wire format).
void ReadConnection(int fd) {
  Link& link = TheLink();
  int sender = -1;
  for (;;) {
    Header h;
    int passed;
    if (!ReadHeader(fd, &h, &passed)) break;
    std::string key(h.key_size, '\0'), bytes(h.size, '\0');
    if (!ReadAll(fd, key.data(), key.size()) || !ReadAll(fd, bytes.data(), bytes.size()) ||
        (sender >= 0 && h.process != sender)) {
      if (passed >= 0) close(passed);
      break;
    }
    sender = h.process;
    if (h.kind == Kind::kData) {
      LinkMessage message{std::move(bytes), passed};
      const LinkHandler handle = link.on_message.load();
      if (handle != nullptr && handle(sender, key, &message)) continue;
      bytes = std::move(message.bytes);
    }
    std::lock_guard<std::mutex> lock(link.mu);
    if (h.kind == Kind::kData) {
      LinkMessage& slot = link.inbox[{sender, std::move(key)}];
      if (slot.fd >= 0) close(slot.fd);
      slot = LinkMessage{std::move(bytes), passed};
    } else if (h.kind == Kind::kAbort) {
      link.aborted.emplace(std::move(key), "process " + std::to_string(sender) + ": " + bytes);
    } else if (passed >= 0) {
      close(passed);
    }
    link.cv.notify_all();
  }
  close(fd);
  if (sender >= 0) {
    {
      std::lock_guard<std::mutex> lock(link.mu);
      link.gone.insert(sender);
      link.cv.notify_all();
    }
    const LinkGoneHandler gone = link.on_gone.load();
    if (gone != nullptr) gone(sender);
  }
}

void Accept(int listener) {
  for (;;) {
    int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    std::thread(ReadConnection, fd).detach();
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
// its name only once it listens, so a refused connection means it is gone.
ffi::Error Connect(const LinkPeer& to, Link::Out** out) {
  Link& link = TheLink();
  {
    std::lock_guard<std::mutex> lock(link.mu);
    if (link.self < 0) {
      return LinkError(ffi::ErrorCode::kFailedPrecondition,
                       Message() << "this process has no link (ListenLink first)");
    }
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
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), size) == 0 &&
      SendMessage(fd, Kind::kHello, link.self, {}, {}, -1)) {
    (*out)->fd = fd;
    return ffi::Error::Success();
  }
  const std::string why = Errno();
  close(fd);
  return LinkError(ffi::ErrorCode::kUnavailable,
                   Message() << "process " << to.process << " is gone (nothing listens on @"
                             << to.name << ": " << why << ")");
}

// Whether the connection to a peer has been closed by it.
bool HungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

ffi::Error ListenLink(const LinkPeer& self) {
  Link& link = TheLink();
  std::lock_guard<std::mutex> lock(link.mu);
  if (link.self >= 0) {
    if (link.self == self.process && link.name == self.name) return ffi::Error::Success();
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
  std::thread(Accept, fd).detach();
  return ffi::Error::Success();
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
    int copy = fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
    std::lock_guard<std::mutex> lock(link.mu);
    LinkMessage& slot = link.inbox[{to.process, std::string(key)}];
    if (slot.fd >= 0) close(slot.fd);
    slot = LinkMessage{std::string(bytes), copy};
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
                       LinkMessage* out) {
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

}  // namespace jax_tma
