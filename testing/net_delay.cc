// net_delay: holds every packet of a netfilter queue for a fixed time before
// accepting it -- the one-way latency of an emulated link, for kernels
// without netem. Packets leave in arrival order (the delay is constant), so
// the link reorders nothing. Used by testing/host_network.h: an iptables
// NFQUEUE rule sends a namespace's packets to queue --queue; this process,
// run in the same namespace, releases each --delay_us after it arrived.
//
// Runs until SIGTERM or SIGINT; a queue overflow (the kernel drops what it
// cannot queue) is counted and printed at exit, as a loss the test sees.
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>

#include "absl/flags/flag.h"
#include "core/command_line.h"

ABSL_FLAG(uint32_t, queue, 0, "the NFQUEUE number to serve");
ABSL_FLAG(uint32_t, delay_us, 100, "how long each packet is held, in microseconds");
ABSL_FLAG(uint32_t, max_packets, 65536, "the most packets held (the kernel's queue length)");

namespace {

volatile sig_atomic_t stopping = 0;
void Stop(int) { stopping = 1; }

int64_t NowNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

struct Held {
  uint32_t id;
  int64_t due_ns;
};

struct Queue {
  std::deque<Held> held;
  int64_t delay_ns = 0;
};

int OnPacket(nfq_q_handle*, nfgenmsg*, nfq_data* data, void* arg) {
  auto* queue = static_cast<Queue*>(arg);
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
  if (header != nullptr)
    queue->held.push_back({ntohl(header->packet_id), NowNs() + queue->delay_ns});
  return 0;
}

int Run() {
  Queue queue;
  queue.delay_ns = int64_t{absl::GetFlag(FLAGS_delay_us)} * 1000;
  nfq_handle* handle = nfq_open();
  if (handle == nullptr) {
    std::fprintf(stderr, "net_delay: nfq_open: %s\n", std::strerror(errno));
    return 1;
  }
  nfq_q_handle* q = nfq_create_queue(handle, absl::GetFlag(FLAGS_queue), &OnPacket, &queue);
  if (q == nullptr) {
    std::fprintf(stderr, "net_delay: queue %u: %s\n", absl::GetFlag(FLAGS_queue),
                 std::strerror(errno));
    return 1;
  }
  // Metadata only: the verdict needs the packet's id, not its bytes. GSO
  // packets are queued whole instead of being segmented for the queue.
  if (nfq_set_mode(q, NFQNL_COPY_META, 0) < 0 ||
      nfq_set_queue_maxlen(q, absl::GetFlag(FLAGS_max_packets)) < 0 ||
      nfq_set_queue_flags(q, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0) {
    std::fprintf(stderr, "net_delay: configuring queue %u: %s\n", absl::GetFlag(FLAGS_queue),
                 std::strerror(errno));
    return 1;
  }
  nfnl_rcvbufsiz(nfq_nfnlh(handle), 32 << 20);
  const int fd = nfq_fd(handle);
  // Wake-ups on time: the default timer slack (50 us) would add to every delay.
  prctl(PR_SET_TIMERSLACK, 1UL);
  signal(SIGTERM, Stop);
  signal(SIGINT, Stop);
  std::printf("net_delay: queue %u, %u us\n", absl::GetFlag(FLAGS_queue),
              absl::GetFlag(FLAGS_delay_us));
  std::fflush(stdout);
  uint64_t overflows = 0;
  alignas(8) char buffer[1 << 16];
  while (!stopping) {
    const int64_t now = NowNs();
    while (!queue.held.empty() && queue.held.front().due_ns <= now) {
      nfq_set_verdict(q, queue.held.front().id, NF_ACCEPT, 0, nullptr);
      queue.held.pop_front();
    }
    timespec wait = {1, 0};
    if (!queue.held.empty()) {
      const int64_t left = queue.held.front().due_ns - now;
      wait = {static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
    }
    pollfd readable = {fd, POLLIN, 0};
    if (ppoll(&readable, 1, &wait, nullptr) <= 0) continue;
    // Everything the socket has now, without blocking.
    while (true) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n > 0) {
        nfq_handle_packet(handle, buffer, static_cast<int>(n));
      } else {
        if (n < 0 && errno == ENOBUFS) ++overflows;
        break;
      }
    }
  }
  for (const Held& held : queue.held) nfq_set_verdict(q, held.id, NF_ACCEPT, 0, nullptr);
  nfq_destroy_queue(q);
  nfq_close(handle);
  std::printf("net_delay: stopped; %llu queue overflows\n",
              static_cast<unsigned long long>(overflows));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  strata::InitCommandLine(argc, argv,
                          "net_delay --queue=N --delay_us=US: holds each packet of NFQUEUE N for "
                          "US microseconds (a test link's latency; see testing/host_network.h).");
  return Run();
}
