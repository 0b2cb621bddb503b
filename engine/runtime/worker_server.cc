#include "engine/runtime/worker_server.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/capture.h"
#include "backends/host_memory.h"
#include "base/status.h"
#include "engine/compile/disk_cache.h"
#include "engine/runtime/worker_protocol.h"
#include "spdlog/spdlog.h"

namespace kiln::runtime::worker {
namespace {

namespace wp = v1::worker;

// An event recorded by one stream's thread and waited on by another's.
struct EventEntry {
  absl::Mutex mu;
  std::unique_ptr<backend::Event> event ABSL_GUARDED_BY(mu);
  bool flushed ABSL_GUARDED_BY(mu) = false;  // its batch was handed to the device
};

class Server;
class StreamWorker;

// A graph captured by one stream (Command.end_capture), replayed on it.
// Created empty when its end_capture arrives and filled by the stream's
// thread, the only thread that reads it.
struct GraphEntry {
  const StreamWorker* owner = nullptr;
  // The events recorded inside it: reported again after each replay.
  std::vector<std::pair<uint64_t, std::shared_ptr<EventEntry>>> events;
  std::unique_ptr<backend::CapturedWork> work;  // last: destroyed before its events
};

// One stream and the thread that runs its command lists in order.
class StreamWorker {
 public:
  struct Item {
    wp::Submit submit;
    std::vector<std::shared_ptr<EventEntry>> records;  // in the submit's record order
    // Per end_capture / replay command, in order (resolved when the submit
    // arrived, so a later destroy_graph cannot pull one from under it).
    std::vector<std::shared_ptr<GraphEntry>> graphs;
    uint64_t reply_id = 0;
    bool destroy = false;
    int64_t received_ns = 0;  // MonotonicNanos when the reader thread had it
  };

  StreamWorker(Server& server, std::unique_ptr<backend::Stream> stream, absl::Duration spin)
      : server_(server), stream_(std::move(stream)), spin_(spin), thread_([this] { Loop(); }) {}
  ~StreamWorker() { thread_.join(); }

  void Enqueue(Item item) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(item));
    queued_.fetch_add(1, std::memory_order_release);
  }
  bool done() const { return done_.load(); }

 private:
  void Loop();
  void Run(Item& item, int64_t started_ns);

  Server& server_;
  std::unique_ptr<backend::Stream> stream_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  const absl::Duration spin_;
  std::atomic<int64_t> queued_ = 0;  // queue_.size(), read without mu_ while polling
  std::atomic<bool> done_ = false;
  // Between synchronizations: the first failure, the events recorded (for
  // their times) and the inline copy-outs.
  absl::Status error_;
  std::vector<std::pair<uint64_t, std::shared_ptr<EventEntry>>> recorded_;
  std::vector<std::unique_ptr<std::string>> inline_out_;
  std::shared_ptr<EventEntry> last_event_;  // the chain event times are measured along
  double last_micros_ = 0;
  // While capturing: where the capture's events start in recorded_.
  bool capturing_ = false;
  size_t capture_start_ = 0;
  std::thread thread_;  // last: starts after every member above exists
};

class Server {
 public:
  Server(const ServeOptions& options, std::unique_ptr<backend::Backend> backend,
         backend::Device* device, std::unique_ptr<backend::Device> wrapped,
         std::unique_ptr<ShmRegion> shm, std::unique_ptr<ShmRegion> arena,
         std::shared_ptr<compile::DiskCache> disk)
      : options_(options),
        backend_(std::move(backend)),
        wrapped_(std::move(wrapped)),
        device_(wrapped_ ? wrapped_.get() : device),
        channel_(options.socket_fd),
        shm_(std::move(shm)),
        arena_(std::move(arena)),
        disk_(std::move(disk)) {
    if (disk_) binaries_ = std::make_unique<compile::KernelBinaryCacheAdapter>(disk_);
  }

  int Loop();
  // Registers the staging region's resident part with the device, so copies
  // through it are DMA with no staging copy (backend::HostMemoryRegistrar; a
  // device without the capability copies as before).
  void RegisterStaging();

  backend::Device& device() { return *device_; }
  ShmRegion& shm() { return *shm_; }
  // kilnd's host arena (base/host_arena.h), when kilnd passed one.
  ShmRegion* arena() { return arena_.get(); }
  void Reply(wp::Reply& reply) {
    reply.set_memory_in_use(device_->memory_in_use());
    if (absl::Status s = channel_.Send(reply); !s.ok()) {
      spdlog::error("device worker: {}", std::string(s.message()));
      _exit(0);  // kilnd went away
    }
  }
  absl::StatusOr<backend::BufferView> View(const wp::View& v) {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find(v.buffer());
    if (it == buffers_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown buffer ", v.buffer()));
    }
    const int64_t size = it->second->size();
    if (v.offset() < 0 || v.bytes() < 0 || v.offset() > size || v.bytes() > size - v.offset()) {
      return absl::InvalidArgumentError(absl::StrCat("view [", v.offset(), ", +", v.bytes(),
                                                     ") outside a buffer of ", size, " bytes"));
    }
    return backend::BufferView{it->second.get(), v.offset(), v.bytes()};
  }
  absl::StatusOr<std::pair<backend::Kernel*, std::string>> Kernel(uint64_t handle) {
    absl::MutexLock lock(&mu_);
    auto it = kernels_.find(handle);
    if (it == kernels_.end()) return absl::InvalidArgumentError(absl::StrCat("unknown kernel ", handle));
    return std::make_pair(it->second.first.get(), it->second.second);
  }
  std::shared_ptr<EventEntry> Event(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(id);
    return it == events_.end() ? nullptr : it->second;
  }

 private:
  void Dispatch(wp::Request request);
  void HandleOnPool(const wp::Request& request);
  void PoolLoop();
  // Stops every thread and releases everything, the backend last.
  void Shutdown();

  const ServeOptions options_;
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<backend::Device> wrapped_;
  backend::Device* const device_;
  Channel channel_;
  std::unique_ptr<ShmRegion> shm_;
  std::unique_ptr<ShmRegion> arena_;
  std::shared_ptr<compile::DiskCache> disk_;
  std::unique_ptr<compile::KernelBinaryCacheAdapter> binaries_;
  // Released before the device (Shutdown), after every stream is gone.
  std::unique_ptr<backend::HostRegistration> staging_registration_;
  std::unique_ptr<backend::HostRegistration> arena_registration_;

  absl::Mutex mu_;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::unique_ptr<backend::Buffer>> buffers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::pair<std::unique_ptr<backend::Kernel>, std::string>> kernels_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<EventEntry>> events_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<GraphEntry>> graphs_ ABSL_GUARDED_BY(mu_);
  // Touched by the reader thread only.
  int64_t received_ns_ = 0;  // when the request being dispatched was read
  std::map<uint64_t, std::unique_ptr<StreamWorker>> streams_;
  std::vector<std::unique_ptr<StreamWorker>> retired_;

  absl::Mutex pool_mu_;
  std::deque<wp::Request> pool_queue_ ABSL_GUARDED_BY(pool_mu_);
  bool pool_stopping_ ABSL_GUARDED_BY(pool_mu_) = false;
  std::vector<std::thread> pool_;
};

void StreamWorker::Loop() {
  for (;;) {
    if (spin_ > absl::ZeroDuration() && queued_.load(std::memory_order_acquire) == 0) {
      const absl::Time until = absl::Now() + spin_;
      while (queued_.load(std::memory_order_acquire) == 0 && absl::Now() < until) {
        std::this_thread::yield();
      }
    }
    Item item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(+[](std::deque<Item>* q) { return !q->empty(); }, &queue_));
      item = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    const int64_t started_ns = MonotonicNanos();
    if (item.destroy) {
      // Everything queued before ran; the stream's destructor waits for its
      // device work as in-process destruction would.
      stream_.reset();
      wp::Reply reply;
      reply.set_id(item.reply_id);
      SetStatus(absl::OkStatus(), &reply);
      done_ = true;
      if (item.reply_id != 0) server_.Reply(reply);
      return;
    }
    Run(item, started_ns);
  }
}

void StreamWorker::Run(Item& item, int64_t started_ns) {
  backend::Device& dev = server_.device();
  size_t next_record = 0, next_graph = 0;
  std::vector<std::shared_ptr<EventEntry>> batch_events;
  // A capture a failure interrupted ends at once (its work never runs) and
  // its events leave the list whose times the next answer reports. (A
  // capture may span submits: kilnd flushes long command lists early.)
  auto abort_capture = [&] {
    if (!capturing_) return;
    capturing_ = false;
    (void)dynamic_cast<backend::CapturingStream&>(*stream_).EndCapture();
    recorded_.resize(std::min(recorded_.size(), capture_start_));
  };
  for (const wp::Command& c : item.submit.commands()) {
    std::shared_ptr<GraphEntry> graph;
    if (c.cmd_case() == wp::Command::kEndCapture || c.cmd_case() == wp::Command::kReplay) {
      graph = next_graph < item.graphs.size() ? item.graphs[next_graph] : nullptr;
      ++next_graph;
    }
    if (c.cmd_case() == wp::Command::kRecord) {
      std::shared_ptr<EventEntry> e = item.records[next_record++];
      batch_events.push_back(e);
      if (!error_.ok()) continue;
      auto ev = stream_->Record();
      if (!ev.ok()) {
        error_ = ev.status();
        abort_capture();
        continue;
      }
      {
        absl::MutexLock lock(&e->mu);
        e->event = std::move(ev).value();
      }
      recorded_.emplace_back(c.record(), e);
      continue;
    }
    if (!error_.ok()) continue;  // the stream failed: skip to the next sync
    absl::Status s;
    switch (c.cmd_case()) {
      case wp::Command::kBeginCapture: {
        auto* capturing = dynamic_cast<backend::CapturingStream*>(stream_.get());
        s = capturing == nullptr ? absl::UnimplementedError("this device's streams cannot capture work")
                                 : capturing->BeginCapture();
        if (s.ok()) {
          capturing_ = true;
          capture_start_ = recorded_.size();
        }
        break;
      }
      case wp::Command::kEndCapture: {
        if (!capturing_ || graph == nullptr) {
          s = absl::FailedPreconditionError("end_capture without begin_capture");
          break;
        }
        capturing_ = false;
        auto work = dynamic_cast<backend::CapturingStream&>(*stream_).EndCapture();
        if (!work.ok()) {
          s = work.status();
          recorded_.resize(std::min(recorded_.size(), capture_start_));
          break;
        }
        graph->owner = this;
        graph->work = std::move(work).value();
        // Not run yet: their times come with the replays.
        graph->events.assign(recorded_.begin() + static_cast<std::ptrdiff_t>(capture_start_),
                             recorded_.end());
        recorded_.resize(capture_start_);
        break;
      }
      case wp::Command::kReplay: {
        if (graph == nullptr || graph->work == nullptr || graph->owner != this) {
          s = absl::InvalidArgumentError(
              absl::StrCat("replay of unknown graph ", c.replay(), " on this stream"));
          break;
        }
        s = graph->work->Replay(*stream_);
        if (s.ok()) recorded_.insert(recorded_.end(), graph->events.begin(), graph->events.end());
        break;
      }
      case wp::Command::kLaunch: {
        auto k = server_.Kernel(c.launch().kernel());
        if (!k.ok()) {
          s = k.status();
          break;
        }
        std::vector<backend::BufferView> ins, outs;
        for (const auto& v : c.launch().inputs()) {
          auto b = server_.View(v);
          if (!b.ok()) s = b.status();
          else ins.push_back(*b);
        }
        for (const auto& v : c.launch().outputs()) {
          auto b = server_.View(v);
          if (!b.ok()) s = b.status();
          else outs.push_back(*b);
        }
        if (s.ok()) {
          s = k->first->Launch(*stream_, ins, outs);
          if (!s.ok()) s = StatusBuilder(s) << "while running " << k->second;
        }
        break;
      }
      case wp::Command::kCopyIn: {
        auto dst = server_.View(c.copy_in().dst());
        if (!dst.ok()) {
          s = dst.status();
          break;
        }
        const void* src = nullptr;
        if (c.copy_in().inline_data()) {
          if (static_cast<int64_t>(c.copy_in().data().size()) != dst->bytes) {
            s = absl::InvalidArgumentError("inline copy of the wrong size");
            break;
          }
          src = c.copy_in().data().data();
        } else {
          ShmRegion* region = c.copy_in().arena() ? server_.arena() : &server_.shm();
          if (region == nullptr || !region->Contains(c.copy_in().shm_offset(), dst->bytes)) {
            s = absl::InvalidArgumentError(c.copy_in().arena()
                                               ? "copy source outside the host arena"
                                               : "copy source outside the staging region");
            break;
          }
          src = region->at(c.copy_in().shm_offset());
        }
        s = dev.CopyToDevice(*stream_, src, *dst);
        break;
      }
      case wp::Command::kCopyOut: {
        auto src = server_.View(c.copy_out().src());
        if (!src.ok()) {
          s = src.status();
          break;
        }
        void* dst = nullptr;
        if (c.copy_out().inline_data()) {
          inline_out_.push_back(std::make_unique<std::string>(src->bytes, '\0'));
          dst = inline_out_.back()->data();
        } else {
          ShmRegion* region = c.copy_out().arena() ? server_.arena() : &server_.shm();
          if (region == nullptr || !region->Contains(c.copy_out().shm_offset(), src->bytes)) {
            s = absl::InvalidArgumentError(c.copy_out().arena()
                                               ? "copy destination outside the host arena"
                                               : "copy destination outside the staging region");
            break;
          }
          dst = region->at(c.copy_out().shm_offset());
        }
        s = dev.CopyToHost(*stream_, *src, dst);
        break;
      }
      case wp::Command::kCopyOnDevice: {
        auto src = server_.View(c.copy_on_device().src());
        auto dst = server_.View(c.copy_on_device().dst());
        s = !src.ok() ? src.status() : !dst.ok() ? dst.status() : dev.CopyOnDevice(*stream_, *src, *dst);
        break;
      }
      case wp::Command::kWait: {
        std::shared_ptr<EventEntry> e = server_.Event(c.wait());
        if (e == nullptr) {
          s = absl::InvalidArgumentError(absl::StrCat("wait on unknown event ", c.wait()));
          break;
        }
        absl::MutexLock lock(&e->mu);
        // kilnd sent the recording batch first; its thread hands it to the
        // device promptly (recording never waits for the device).
        if (!e->mu.AwaitWithTimeout(absl::Condition(&e->flushed), absl::Seconds(60))) {
          s = absl::DeadlineExceededError("the awaited event's stream did not flush");
          break;
        }
        if (e->event == nullptr) {
          s = absl::FailedPreconditionError("the awaited event was never recorded (its stream failed)");
          break;
        }
        s = stream_->Wait(*e->event);
        break;
      }
      default:
        s = absl::InvalidArgumentError("unknown command");
    }
    if (!s.ok()) {
      error_ = s;
      abort_capture();
    }
  }
  if (error_.ok()) {
    if (absl::Status s = stream_->FlushWork(); !s.ok()) error_ = s;
  }
  for (auto& e : batch_events) {
    absl::MutexLock lock(&e->mu);
    e->flushed = true;
  }
  if (!item.submit.sync()) return;
  wp::Reply reply;
  reply.set_id(item.reply_id);
  wp::SyncTimes* times = reply.mutable_sync_times();
  times->set_received(item.received_ns);
  times->set_started(started_ns);
  times->set_launched(MonotonicNanos());
  absl::Status s = stream_->SynchronizeFor(absl::Microseconds(item.submit.timeout_micros()));
  times->set_done(MonotonicNanos());
  if (error_.ok()) error_ = s;
  if (error_.ok()) {
    for (auto& [id, e] : recorded_) {
      double micros = 0;
      if (last_event_ != nullptr && last_event_ != e) {
        // One entry lock at a time (a replay reports the same entries again,
        // in any order relative to the last one: holding two would order
        // them both ways). Only this thread sets an entry's event, once.
        backend::Event* now;
        backend::Event* before;
        {
          absl::MutexLock a(&e->mu);
          now = e->event.get();
        }
        {
          absl::MutexLock b(&last_event_->mu);
          before = last_event_->event.get();
        }
        auto d = now != nullptr && before != nullptr
                     ? now->MicrosSince(*before)
                     : absl::StatusOr<double>(absl::FailedPreconditionError("not recorded"));
        micros = last_micros_ + (d.ok() ? *d : 0);
      }
      last_event_ = e;
      last_micros_ = micros;
      wp::EventTime* t = reply.add_events();
      t->set_event(id);
      t->set_micros(micros);
    }
    for (auto& bytes : inline_out_) reply.add_copy_out(std::move(*bytes));
  }
  SetStatus(error_, &reply);
  // An ordinary failure is reported once; a device fault stays (the stream,
  // like the device, is done).
  if (!backend::FaultedDevice(error_)) error_ = absl::OkStatus();
  recorded_.clear();
  inline_out_.clear();
  times->set_replied(MonotonicNanos());
  server_.Reply(reply);
}

void Server::RegisterStaging() {
  // kilnd keeps a copy's staging block until the answer to the
  // synchronization that passed the copy (RemoteStream::FreeStaging), which
  // is the registration's contract. Pages above the resident part may be
  // punched out of the region by kilnd and come back as other pages: never
  // pinned.
  const int64_t bytes = std::min(shm_->size(), kShmResidentBytes);
  auto* registrar = dynamic_cast<backend::HostMemoryRegistrar*>(device_);
  if (registrar == nullptr) return;  // copies stage through the device's own memory
  if (bytes > 0) {
    auto r = registrar->RegisterHostMemory(shm_->at(0), bytes);
    if (r.ok()) {
      staging_registration_ = std::move(r).value();
    } else {
      spdlog::warn("device worker: copies stage through host memory: {}",
                   std::string(r.status().message()));
    }
  }
  // kilnd's host arena, whole: kilnd never punches its pages out, and it
  // holds a block from the copy that names it until the answer to the
  // synchronization that passes the copy, or until this process is gone
  // (the registration's contract).
  if (arena_ != nullptr && arena_->size() > 0) {
    auto a = registrar->RegisterHostMemory(arena_->at(0), arena_->size());
    if (a.ok()) {
      arena_registration_ = std::move(a).value();
    } else {
      spdlog::warn("device worker: copies from the host arena stage through host memory: {}",
                   std::string(a.status().message()));
    }
  }
}

int Server::Loop() {
  RegisterStaging();
  for (int i = 0; i < 4; ++i) pool_.emplace_back([this] { PoolLoop(); });
  for (;;) {
    wp::Request request;
    // The next run's Submit often follows within the spin: polled for, it
    // costs no wake-up.
    absl::Status s = channel_.Receive(&request, absl::Microseconds(options_.queue_spin_micros));
    received_ns_ = MonotonicNanos();
    if (!s.ok()) {
      // kilnd closed the socket (shutdown) or died: nothing left to serve.
      // Close down in order, so the backend keeps what it saves at the end
      // (Vulkan's pipeline cache), unless a thread stuck in the driver holds
      // that up: then go anyway.
      std::thread([] {
        absl::SleepFor(absl::Seconds(8));
        _exit(0);
      }).detach();
      Shutdown();
      std::fflush(nullptr);
      _exit(0);
    }
    Dispatch(std::move(request));
  }
}

void Server::Dispatch(wp::Request request) {
  switch (request.op_case()) {
    case wp::Request::kSubmit: {
      const wp::Submit& sub = request.submit();
      auto it = streams_.find(sub.stream());
      StreamWorker::Item item;
      {
        absl::MutexLock lock(&mu_);
        for (const wp::Command& c : sub.commands()) {
          if (c.cmd_case() == wp::Command::kEndCapture) {
            auto g = std::make_shared<GraphEntry>();
            graphs_[c.end_capture()] = g;
            item.graphs.push_back(std::move(g));
            continue;
          }
          if (c.cmd_case() == wp::Command::kReplay) {
            auto it = graphs_.find(c.replay());
            item.graphs.push_back(it == graphs_.end() ? nullptr : it->second);
            continue;
          }
          if (c.cmd_case() != wp::Command::kRecord) continue;
          auto e = std::make_shared<EventEntry>();
          events_[c.record()] = e;
          item.records.push_back(std::move(e));
        }
      }
      if (it == streams_.end()) {
        if (request.id() != 0) {
          wp::Reply reply;
          reply.set_id(request.id());
          SetStatus(absl::InvalidArgumentError(absl::StrCat("unknown stream ", sub.stream())), &reply);
          Reply(reply);
        }
        return;
      }
      item.reply_id = request.id();
      item.received_ns = received_ns_;
      item.submit = std::move(*request.mutable_submit());
      it->second->Enqueue(std::move(item));
      return;
    }
    case wp::Request::kDestroyStream: {
      auto it = streams_.find(request.destroy_stream());
      if (it == streams_.end()) {
        wp::Reply reply;
        reply.set_id(request.id());
        SetStatus(absl::OkStatus(), &reply);
        Reply(reply);
        return;
      }
      StreamWorker::Item item;
      item.destroy = true;
      item.reply_id = request.id();
      it->second->Enqueue(std::move(item));
      retired_.push_back(std::move(it->second));
      streams_.erase(it);
      // Join the threads of streams that are gone.
      for (auto r = retired_.begin(); r != retired_.end();) {
        r = (*r)->done() ? retired_.erase(r) : std::next(r);
      }
      return;
    }
    case wp::Request::kCreateStream: {
      wp::Reply reply;
      reply.set_id(request.id());
      auto stream = device_->CreateStream();
      SetStatus(stream.status(), &reply);
      if (stream.ok()) {
        uint64_t h;
        {
          absl::MutexLock lock(&mu_);
          h = next_handle_++;
        }
        streams_[h] = std::make_unique<StreamWorker>(
            *this, std::move(stream).value(), absl::Microseconds(options_.queue_spin_micros));
        reply.set_handle(h);
      }
      Reply(reply);
      return;
    }
    case wp::Request::kDestroyEvent: {
      absl::MutexLock lock(&mu_);
      events_.erase(request.destroy_event());
      return;
    }
    case wp::Request::kDestroyGraph: {
      std::shared_ptr<GraphEntry> g;  // released outside the lock
      absl::MutexLock lock(&mu_);
      auto it = graphs_.find(request.destroy_graph());
      if (it == graphs_.end()) return;
      g = std::move(it->second);
      graphs_.erase(it);
      return;
    }
    case wp::Request::kFree: {
      absl::MutexLock lock(&mu_);
      buffers_.erase(request.free());
      return;
    }
    case wp::Request::kDestroyKernel: {
      absl::MutexLock lock(&mu_);
      kernels_.erase(request.destroy_kernel());
      return;
    }
    default: {
      absl::MutexLock lock(&pool_mu_);
      pool_queue_.push_back(std::move(request));
      return;
    }
  }
}

void Server::Shutdown() {
  for (auto& [handle, stream] : streams_) {
    StreamWorker::Item item;
    item.destroy = true;  // reply_id 0: nobody to answer
    stream->Enqueue(std::move(item));
  }
  streams_.clear();  // joins each stream's thread after its queue ran
  retired_.clear();
  {
    absl::MutexLock lock(&pool_mu_);
    pool_stopping_ = true;
  }
  for (std::thread& t : pool_) t.join();
  staging_registration_.reset();  // no copy is in flight: every stream is gone
  arena_registration_.reset();
  {
    absl::MutexLock lock(&mu_);
    graphs_.clear();  // before the kernels and events they captured
    kernels_.clear();
    events_.clear();
    buffers_.clear();
  }
  wrapped_.reset();
  backend_.reset();
}

void Server::PoolLoop() {
  for (;;) {
    wp::Request request;
    {
      absl::MutexLock lock(&pool_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu_) {
        return pool_stopping_ || !pool_queue_.empty();
      };
      pool_mu_.Await(absl::Condition(&ready));
      if (pool_queue_.empty()) return;  // stopping
      request = std::move(pool_queue_.front());
      pool_queue_.pop_front();
    }
    HandleOnPool(request);
  }
}

void Server::HandleOnPool(const wp::Request& request) {
  wp::Reply reply;
  reply.set_id(request.id());
  switch (request.op_case()) {
    case wp::Request::kAllocate: {
      auto buf = device_->Allocate(request.allocate());
      SetStatus(buf.status(), &reply);
      if (buf.ok()) {
        absl::MutexLock lock(&mu_);
        const uint64_t h = next_handle_++;
        buffers_[h] = std::move(buf).value();
        reply.set_handle(h);
      }
      break;
    }
    case wp::Request::kSupports: {
      const backend::Claim claim = device_->Supports(FromProto(request.supports()));
      SetStatus(absl::OkStatus(), &reply);
      reply.set_native(claim.native);
      reply.set_reason(claim.reason);
      break;
    }
    case wp::Request::kPrepare: {
      backend::PrepareContext ctx;
      ctx.binaries = binaries_.get();
      auto k = device_->PrepareKernel(FromProto(request.prepare()), ctx);
      SetStatus(k.status(), &reply);
      reply.set_cache_hits(ctx.kernel_cache_hits);
      reply.set_cache_misses(ctx.kernel_cache_misses);
      if (k.ok()) {
        reply.set_implementation((*k)->implementation());
        const auto* capturable = dynamic_cast<const backend::CapturableKernel*>(k->get());
        reply.set_capturable(capturable != nullptr && capturable->capturable());
        absl::MutexLock lock(&mu_);
        const uint64_t h = next_handle_++;
        kernels_[h] = {std::move(k).value(), request.prepare().label()};
        reply.set_handle(h);
      }
      break;
    }
    case wp::Request::kHello: {
      SetStatus(absl::OkStatus(), &reply);
      wp::HelloReply* h = reply.mutable_hello();
      h->set_protocol(kProtocol);
      h->set_backend(backend_->name());
      h->set_version(backend_->version());
      for (backend::Device* d : backend_->devices()) {
        backend::DeviceInfo info = d->info();
        if (d == device_ || (wrapped_ && d == backend_->devices()[options_.device_index])) {
          info = device_->info();
        }
        ToProto(info, h->add_devices());
      }
      h->set_serving(options_.device_index);
      h->set_pid(::getpid());
      break;
    }
    default:
      SetStatus(absl::InvalidArgumentError("unknown device worker request"), &reply);
  }
  if (request.id() != 0) Reply(reply);
}

}  // namespace

int Serve(const ServeOptions& options, const DeviceWrapper& wrap) {
  // The worker goes when kilnd does, whatever kilnd dies of: its end of the
  // socket closes and the reading thread exits the process, even while other
  // threads are stuck in the driver. (Not PR_SET_PDEATHSIG: that fires when
  // the kilnd *thread* that started the worker ends, such as the one that
  // restarts devices.)
  std::signal(SIGPIPE, SIG_IGN);
  // Errors before the first Hello are answered to it, so kilnd logs them.
  absl::Status failure;
  auto shm = ShmRegion::Map(options.shm_fd);
  std::unique_ptr<ShmRegion> arena;
  if (options.arena_fd >= 0) {
    auto a = ShmRegion::Map(options.arena_fd);
    if (a.ok()) {
      arena = std::move(a).value();
    } else {
      failure = a.status();
    }
  }

  std::unique_ptr<backend::Backend> backend;
  for (const auto& reg : backend::RegisteredBackends()) {
    if (reg.name != options.backend) continue;
    auto b = reg.factory(options.backend_options);
    if (!b.ok()) failure.Update(b.status());
    else backend = std::move(b).value();
  }
  if (!shm.ok()) failure.Update(shm.status());
  if (failure.ok() && backend == nullptr) {
    failure = absl::NotFoundError(absl::StrCat("no backend named \"", options.backend, "\" in this worker"));
  }
  if (failure.ok() && (options.device_index < 0 ||
                       options.device_index >= static_cast<int>(backend->devices().size()))) {
    failure = absl::NotFoundError(absl::StrCat(options.backend, " has ", backend->devices().size(),
                                               " devices; no device ", options.device_index));
  }
  if (!failure.ok()) {
    Channel channel(options.socket_fd);
    wp::Request hello;
    if (channel.Receive(&hello).ok()) {
      wp::Reply reply;
      reply.set_id(hello.id());
      SetStatus(failure, &reply);
      (void)channel.Send(reply);
    }
    return 1;
  }
  std::shared_ptr<compile::DiskCache> disk;
  if (!options.backend_options.cache_dir.empty()) {
    compile::DiskCacheOptions co;
    co.dir = options.backend_options.cache_dir;
    co.max_bytes = options.cache_max_bytes;
    auto d = compile::DiskCache::Create(co);
    if (d.ok()) disk = std::move(d).value();
    else spdlog::warn("device worker: no kernel cache: {}", std::string(d.status().message()));
  }
  backend::Device* device = backend->devices()[options.device_index];
  std::unique_ptr<backend::Device> wrapped = wrap ? wrap(*device) : nullptr;
  Server server(options, std::move(backend), device, std::move(wrapped), std::move(shm).value(),
                std::move(arena), std::move(disk));
  return server.Loop();
}

}  // namespace kiln::runtime::worker
