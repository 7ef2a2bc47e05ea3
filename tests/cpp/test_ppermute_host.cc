// The process link of jax_tma.ppermute (ffi/ppermute/peer_link.h) between
// two real processes (fork): bytes and a file descriptor travel (a memfd
// both map: one page of shared memory), aborts reach the waiter with their
// reason, waits time out, a process that exits is gone at once, and a name
// nothing listens on is refused.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include "check.h"
#include "ppermute/peer_link.h"

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

// Whether `err` failed with `code` and says `text`.
bool FailedWith(const ffi::Error& err, ffi::ErrorCode code, const char* text) {
  return err.failure() && *err.errc() == code &&
         std::string(err.message()).find(text) != std::string::npos;
}

// Waits for `key` (abort key "abort:" + key) from `from`; `took` receives how
// long the wait lasted.
ffi::Error TimedReceive(const LinkPeer& from, const std::string& key, const std::string& what,
                        milliseconds timeout, std::chrono::steady_clock::duration* took) {
  LinkMessage got;
  const auto start = std::chrono::steady_clock::now();
  ffi::Error err = ReceiveLink(from, key, "abort:" + key, what, timeout, &got);
  *took = std::chrono::steady_clock::now() - start;
  return err;
}

// Process 1: takes the page, answers through it, aborts a call, then exits.
int Child(const std::string& parent_name, const std::string& own_name) {
  const LinkPeer parent{0, parent_name};
  CHECK(ListenLink(LinkPeer{1, own_name}).success());
  LinkMessage got;
  // The parent listens once it has forked this process: until then it is
  // refused as gone.
  ffi::Error err = ReceiveLink(parent, "page", "abort:page", "the page", milliseconds(10000), &got);
  for (int i = 0; i < 500 && err.failure() && *err.errc() == ffi::ErrorCode::kUnavailable; ++i) {
    usleep(10000);
    err = ReceiveLink(parent, "page", "abort:page", "the page", milliseconds(10000), &got);
  }
  CHECK(err.success());
  CHECK_EQ(got.bytes, std::string("a page"));
  CHECK(got.fd >= 0);
  char* page = got.fd >= 0 ? MapPage(got.fd) : nullptr;
  CHECK(page != nullptr);
  if (page != nullptr) {
    CHECK_EQ(std::string(page), std::string("from process 0"));
    std::strcpy(page, "from process 1");
  }
  CHECK(SendLink(parent, "answered", "").success());
  AbortLink(parent, "abort:call 7", "its block was lost");
  // Wait until the parent has seen the abort, then exit: the parent's next
  // wait finds this process gone.
  CHECK(ReceiveLink(parent, "bye", "abort:bye", "bye", milliseconds(10000), &got).success());
  return ::jax_tma::testing::FailureCount();
}

void Parent(pid_t child, const std::string& own_name, const std::string& child_name) {
  const LinkPeer self{0, own_name}, peer{1, child_name};
  // A second name for this process is refused; the same one is not.
  CHECK(ListenLink(self).success());
  const ffi::Error twice = ListenLink(LinkPeer{0, own_name + ".other"});
  CHECK(FailedWith(twice, ffi::ErrorCode::kFailedPrecondition, "already listens as process 0"));

  // To itself: straight into its own inbox.
  LinkMessage got;
  CHECK(SendLink(self, "note", "to myself").success());
  CHECK(ReceiveLink(self, "note", "abort:note", "a note", milliseconds(100), &got).success());
  CHECK_EQ(got.bytes, std::string("to myself"));

  // A page of shared memory, passed as a descriptor (the peer may not be
  // listening yet: it is refused until it does).
  const int fd = memfd_create("jax_tma_test_ppermute_host", MFD_CLOEXEC);
  CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
  char* page = MapPage(fd);
  CHECK(page != nullptr);
  if (page == nullptr) return;
  std::strcpy(page, "from process 0");
  ffi::Error sent = SendLink(peer, "page", "a page", fd);
  for (int i = 0; i < 500 && sent.failure(); ++i) {
    usleep(10000);
    sent = SendLink(peer, "page", "a page", fd);
  }
  CHECK(sent.success());
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
  err = SendLink(LinkPeer{2, own_name + ".nobody"}, "x", "");
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
