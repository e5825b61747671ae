// grace._grace: Grace's embedding API (actors/session.hpp) for Python. Thin:
// the state lives in grace::session; the torch and numpy conveniences are
// Python (python/grace/).
//
// The GIL: every call that can block (attach, a step boundary, a save,
// finish, a collective, closing) releases it. Grace's own threads never take
// it: notices, heartbeats, acknowledgements and aborts run in C++ alone. Only
// the trainer thread takes it back, for the blob callbacks Grace calls on
// that thread (at a checkpoint, and in attach() when restoring).
//
// Signals: grace::session blocks SIGTERM/SIGINT in the thread that creates it
// and in the threads started after; attach() starts the signal watcher,
// whose handler replaces Python's. While attached, Ctrl-C is a notice (save,
// exit with the restart code), never a KeyboardInterrupt. Notice callbacks
// (on_notice; grace.Session chains the Python handlers installed before it
// through them) run on the trainer thread at the next step boundary. close()
// puts back the handlers and the signal mask found at construction.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/base/cancel_token.hpp"
#include "runtime/train/gloo_comm.hpp"
#include "actors/session.hpp"
#include "runtime/worker/standby.hpp"

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/spdlog.h>

#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace py = pybind11;

namespace {

/// grace.GraceError: bad input, a failed attach/finish, misuse.
struct grace_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// grace.CollectiveError (a GraceError): a collective failed or was aborted.
struct collective_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A stop Grace decided (a notice, a lost peer, an error elsewhere) with
/// exit_on_stop: raised in Python as grace.Preempted (the restart code) or
/// grace.Stopped, SystemExit subclasses carrying the exit code, so finally
/// blocks, context managers and atexit handlers run as the process ends.
struct session_stopped {
  int code;
  std::string reason;
  bool restart;
};

/// grace.Stopped and grace.Preempted, handed over by python/grace/session.py
/// at import. Never released: the translator may run until the interpreter
/// ends.
PyObject* g_stop_classes[2] = {nullptr, nullptr};

void translate_stop(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const session_stopped& s) {
    PyObject* cls = g_stop_classes[s.restart ? 1 : 0];
    py::object exc = cls ? py::reinterpret_borrow<py::object>(cls)(s.code, s.reason)
                         : py::reinterpret_borrow<py::object>(PyExc_SystemExit)(s.code);
    if (!cls) cls = PyExc_SystemExit;
    PyErr_SetObject(cls, exc.ptr());
  }
}

/// Flushes sys.stdout and sys.stderr (before an _Exit skips Python's own).
void flush_python_stdio() {
  for (const char* name : {"stdout", "stderr"}) {
    PyObject* f = PySys_GetObject(name);  // borrowed
    if (!f || f == Py_None) continue;
    PyObject* r = PyObject_CallMethod(f, "flush", nullptr);
    if (r)
      Py_DECREF(r);
    else
      PyErr_Clear();
  }
}

/// The process's SIGINT/SIGTERM handlers and the creating thread's signal
/// mask, saved before grace::session blocks the signals and its watcher
/// takes them, put back when the session closes.
struct signal_state {
  pthread_t thread = pthread_self();
  sigset_t mask;
  struct sigaction on_int {
  }, on_term{};
  void save() {
    thread = pthread_self();
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    sigaction(SIGINT, nullptr, &on_int);
    sigaction(SIGTERM, nullptr, &on_term);
  }
  void restore() const {
    sigaction(SIGINT, &on_int, nullptr);
    sigaction(SIGTERM, &on_term, nullptr);
    if (pthread_equal(thread, pthread_self())) pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  }
};

/// What the session's abort handler unblocks when a peer is lost: Grace's
/// own ring, and the sockets of a process group the trainer made itself
/// (torch.distributed's Gloo group has no abort in torch 1.13; shutting its
/// sockets down makes a blocked collective fail at once, here and, as the
/// connections close, on the peers). Runs on a Grace thread, never Python.
struct abort_targets {
  std::mutex m;
  std::shared_ptr<grace::gloo_comm> comm;
  std::shared_ptr<grace::cancel_token> rendezvous;  ///< a connect in progress (runtime/base/cancel_token.hpp)
  std::vector<int> fds;
  void abort() {
    std::lock_guard<std::mutex> g(m);
    if (rendezvous) rendezvous->cancel();
    if (comm) comm->abort();
    for (int fd : fds) {
      struct stat st;
      if (::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) ::shutdown(fd, SHUT_RDWR);
    }
  }
};

/// A connected TCP socket that is not a listener and not on `skip_port`
/// (torch's TCPStore at MASTER_PORT, whose server thread must not see it).
bool peer_socket(int fd, int skip_port) {
  int listening = 0;
  socklen_t len = sizeof listening;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening) return false;
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof local, pl = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
    return false;
  auto port = [](const sockaddr_storage& a) -> int {
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return -1;
  };
  if (port(local) < 0) return false;  // not TCP/IP (a Unix socket)
  return port(local) != skip_port && port(peer) != skip_port;
}

grace::dtype dtype_from_name(const std::string& name, const std::string& tensor) {
  grace::dtype t;
  if (!grace::parse_dtype(name, t))
    throw py::type_error("'" + tensor + "': dtype '" + name + "' cannot be stored in safetensors");
  return t;
}

/// The safetensors dtype of a buffer-protocol format ('<f', 'd', '?', ...).
grace::dtype dtype_from_format(std::string fmt, ssize_t itemsize, const std::string& tensor) {
  if (!fmt.empty() && (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')) fmt.erase(0, 1);
  auto bad = [&] {
    return py::type_error("'" + tensor + "': element format '" + fmt +
                          "' cannot be stored in safetensors (need a little-endian bool, int, uint or float)");
  };
  if (fmt.size() != 1) throw bad();
  const bool is_signed = fmt == "b" || fmt == "h" || fmt == "i" || fmt == "l" || fmt == "q";
  const bool is_unsigned = fmt == "B" || fmt == "H" || fmt == "I" || fmt == "L" || fmt == "Q";
  using grace::dtype;
  if (fmt == "?" && itemsize == 1) return dtype::boolean;
  if (fmt == "e" && itemsize == 2) return dtype::f16;
  if (fmt == "f" && itemsize == 4) return dtype::f32;
  if (fmt == "d" && itemsize == 8) return dtype::f64;
  if (is_signed || is_unsigned) {
    switch (itemsize) {
      case 1: return is_signed ? dtype::i8 : dtype::u8;
      case 2: return is_signed ? dtype::i16 : dtype::u16;
      case 4: return is_signed ? dtype::i32 : dtype::u32;
      case 8: return is_signed ? dtype::i64 : dtype::u64;
    }
  }
  throw bad();
}

/// Notices this process received (grace::options::notice_observer), from
/// Grace's signal thread to the trainer thread, which runs the Python
/// callbacks at its next step boundary.
struct notice_queue {
  std::mutex m;
  std::deque<std::pair<std::string, std::string>> items;  ///< (source, detail)
  std::atomic<bool> any{false};
  void push(const std::string& source, const std::string& detail) {
    std::lock_guard<std::mutex> g(m);
    items.emplace_back(source, detail);
    any.store(true, std::memory_order_release);
  }
  std::deque<std::pair<std::string, std::string>> take() {
    std::deque<std::pair<std::string, std::string>> out;
    std::lock_guard<std::mutex> g(m);
    any.store(false, std::memory_order_relaxed);
    out.swap(items);
    return out;
  }
};

class py_session {
public:
  py_session(grace::options o, bool exit_on_stop, int collective_timeout_ms, int stop_deadline_ms,
             bool recover_in_place)
      : exit_on_stop_(exit_on_stop),
        collective_timeout_(collective_timeout_ms),
        stop_deadline_(stop_deadline_ms),
        restart_code_(o.restart_exit_code) {
    signals_.save();
    o.notice_observer = [q = notices_](const std::string& source, const std::string& detail) {
      q->push(source, detail);
    };
    s_ = std::make_unique<grace::session>(std::move(o));
    // Recovery in place (grace-launch --recovery in-place): Grace's ring is
    // formed again for the new group, on the trainer thread inside the step
    // boundary (the GIL released), or in a replacement's attach().
    if (recover_in_place) s_->on_world_change([this] { return reconnect(); });
    in_place_ = recover_in_place;
  }

  /// `callback(source, detail)` for every notice this process receives
  /// (a signal, the notice file or command), run on the trainer thread at
  /// the next step boundary, before Grace acts on the notice there.
  void on_notice(py::function callback) {
    alive();
    notice_callbacks_.push_back(std::move(callback));
  }
  ~py_session() { close(); }

  void register_memory(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, uintptr_t ptr,
                       py::object owner, std::vector<int64_t> global_shape, std::vector<int64_t> offsets) {
    check_registration(name);
    for (auto d : shape)
      if (d < 0) throw py::value_error("'" + name + "': negative dimension");
    grace::tensor_ref t{name, dtype_from_name(dtype, name), std::move(shape), reinterpret_cast<void*>(ptr)};
    if (t.bytes() > 0 && !t.data) throw py::value_error("'" + name + "': no memory (null data pointer)");
    add(sliced(std::move(t), std::move(global_shape), std::move(offsets)), std::move(owner));
  }

  /// A sharded tensor's place in its global tensor (both empty: replicated).
  static grace::tensor_ref sliced(grace::tensor_ref t, std::vector<int64_t> global_shape, std::vector<int64_t> offsets) {
    if (global_shape.empty() && !offsets.empty())
      throw py::value_error("'" + t.name + "': offsets given without global_shape");
    if (!global_shape.empty() && offsets.empty()) offsets.assign(global_shape.size(), 0);
    t.global_shape = std::move(global_shape);
    t.offsets = std::move(offsets);
    if (auto why = grace::slice_problem(t); !why.empty()) throw py::value_error(why);
    return t;
  }

  /// An object with the buffer protocol (a numpy array): C-contiguous and
  /// writable, registered where it lies.
  void register_buffer(const std::string& name, py::object obj, std::vector<int64_t> global_shape,
                       std::vector<int64_t> offsets) {
    check_registration(name);
    if (!PyObject_CheckBuffer(obj.ptr()))
      throw py::type_error("'" + name + "': " + std::string(py::str(obj.get_type())) +
                           " has no buffer (pass a numpy array, or use register_tensor for torch)");
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
    std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(&view, PyBuffer_Release);
    if (view.readonly) throw py::value_error("'" + name + "' is read-only: Grace restores into it");
    if (!PyBuffer_IsContiguous(&view, 'C'))
      throw py::value_error("'" + name +
                            "' is not C-contiguous: register a contiguous array "
                            "(numpy.ascontiguousarray) and train on that one");
    grace::dtype t = dtype_from_format(view.format ? view.format : "B", view.itemsize, name);
    std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
    add(sliced(grace::tensor_ref{name, t, std::move(shape), view.buf}, std::move(global_shape), std::move(offsets)),
        std::move(obj));
  }

  /// A counter saved in the manifest; returns its storage (stable address).
  int64_t* counter(const std::string& name, int64_t initial) {
    check_registration(name);
    counters_.push_back(initial);
    s_->register_counter(name, &counters_.back());
    return &counters_.back();
  }

  /// A blob: `snapshot()` runs at every step boundary (cheap: copy the state
  /// as a Python object); at a checkpoint `encode(snapshot)` -> bytes (or the
  /// snapshot itself when it is bytes and there is no encode). So every save,
  /// a just-in-time one after a failed step included, holds the state as of
  /// the last completed step, not one a failed step had half advanced.
  void register_blob(const std::string& name, py::function snapshot, py::object encode, py::function restore) {
    check_registration(name);
    blobs_.push_back(std::make_unique<blob>(blob{snapshot, encode, restore, py::none(), false}));
    // The session keeps a plain pointer (it is destroyed without the GIL);
    // this object owns the Python references.
    blob* b = blobs_.back().get();
    s_->register_blob(
        name,
        [b]() -> std::string {
          py::gil_scoped_acquire gil;
          try {
            py::object snap = b->have ? b->cached : b->snapshot();
            py::object r = b->encode.is_none() ? snap : b->encode(snap);
            py::object bytes = py::reinterpret_steal<py::object>(PyBytes_FromObject(r.ptr()));
            if (!bytes) throw py::error_already_set();
            return std::string(PyBytes_AS_STRING(bytes.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(bytes.ptr())));
          } catch (py::error_already_set& e) {
            throw std::runtime_error(e.what());
          }
        },
        [b](const std::string& bytes) {
          py::gil_scoped_acquire gil;
          try {
            b->restore(py::bytes(bytes));
          } catch (py::error_already_set& e) {
            throw std::runtime_error(e.what());
          }
        });
  }

  uint64_t attach() {
    alive();
    if (attached_) throw grace_error("attach() called twice");
    grace::result<uint64_t> r = uint64_t(0);
    {
      py::gil_scoped_release nogil;
      r = s_->attach();
    }
    attach_exit_code_.reset();
    if (!r) {
      // Only a refusal for now or an unreachable service stops the worker
      // with a code; bad input and failures (bugs) raise.
      const auto c = r.err().code;
      if (c == grace::errc::preempted || c == grace::errc::overloaded || c == grace::errc::disconnected)
        attach_exit_code_ = grace::attach_failure_exit(c, restart_code_);
      throw grace_error(r.err().what());
    }
    attached_ = true;
    return *r;
  }
  /// After attach() failed for a reason that is not bad input: the exit
  /// code a worker stops with (restart, or no_rendezvous); else None.
  std::optional<int> attach_exit_code() const { return attach_exit_code_; }

  /// One iteration of `for step in g.steps(total)`: ends the step in
  /// flight, begins the next; 0 when the loop is over (done or stopped).
  uint64_t next_step(uint64_t total) {
    alive();
    if (!attached_) throw grace_error("steps() before attach()");
    grace::step_result r = grace::step_result::ok;
    uint64_t k = 0;
    require_checked();
    abandoned_ = checked_ = false;
    restore_abandoned();
    capture_blobs();
    {
      py::gil_scoped_release nogil;
      if (in_step_) {
        in_step_ = false;
        s_->end_step();
      }
      k = s_->completed_steps() + 1;
      if (k <= total && !stopped_) r = s_->begin_step();
    }
    if (k > total || stopped_) return 0;
    if (r == grace::step_result::stop) {
      on_stop();
      return 0;
    }
    in_step_ = true;
    return k;
  }

  /// False when the session stopped instead (and stayed: exit_on_stop off).
  bool begin_step() {
    alive();
    if (!attached_) throw grace_error("begin_step() before attach()");
    if (in_step_) throw grace_error("begin_step() while a step is in flight: end_step() first");
    require_checked();
    abandoned_ = checked_ = false;
    restore_abandoned();
    capture_blobs();
    grace::step_result r;
    {
      py::gil_scoped_release nogil;
      r = s_->begin_step();
    }
    if (r == grace::step_result::stop) {
      on_stop();
      return false;
    }
    in_step_ = true;
    return true;
  }

  void end_step() {
    alive();
    if (abandoned_) return require_checked();  // recovered in place: the step did not happen, begin it again
    if (!in_step_) throw grace_error("end_step() without begin_step()");
    capture_blobs();
    in_step_ = false;
    py::gil_scoped_release nogil;
    s_->end_step();
  }

  /// The step (or, between steps, the code around them) raised: report it
  /// (collective: wait for the coordinator's verdict instead). Returns the
  /// exit code; the caller exits or re-raises.
  int fail_step(const std::string& what, bool collective) {
    alive();
    if (!attached_ || stopped_) return s_->exit_code();
    in_step_ = false;
    grace::step_result r;
    {
      py::gil_scoped_release nogil;
      r = s_->fail_step(what, collective);
    }
    stopped_ = true;
    // Recovered in place, but Python already left the loop (the exception
    // escaped it): this worker cannot go on with the repaired group, so it
    // stops with the restart code (never 0: the launcher would take it for
    // a finished worker).
    if (r == grace::step_result::ok) return restart_code_;
    return s_->exit_code();
  }

  void finish() {
    alive();
    if (!attached_) throw grace_error("finish() before attach()");
    if (stopped_) throw grace_error("finish() after a stop (" + s_->stop_reason() + ")");
    if (finished_) return;
    capture_blobs();
    grace::status st;
    {
      py::gil_scoped_release nogil;
      if (in_step_) {
        in_step_ = false;
        s_->end_step();
      }
      st = s_->finish();
    }
    if (!st) throw grace_error("finish: " + st.err().what());
    finished_ = true;
  }

  [[noreturn]] void quick_exit(int code) {
    flush_python_stdio();
    if (s_) s_->quick_exit(code);
    std::_Exit(code);
  }

  /// The session stopped and Python was told (grace.Stopped): the process
  /// ends with `code` within the stop deadline even if the trainer catches
  /// the exception or its teardown hangs (a non-daemon thread, a stuck
  /// flush). A detached thread that never touches Python; once per session.
  void arm_stop_deadline(int code) {
    if (deadline_armed_ || stop_deadline_.count() <= 0) return;
    deadline_armed_ = true;
    std::thread([code, after = stop_deadline_] {
      std::this_thread::sleep_for(after);
      const std::string msg = "grace: the process was still running " + std::to_string(after.count()) +
                              " ms (stop_deadline_ms) after the session stopped: ending it with exit code " +
                              std::to_string(code) + "\n";
      ssize_t ignored = ::write(2, msg.data(), msg.size());  // no stdio: its lock may be what hangs
      (void)ignored;
      std::_Exit(code);
    }).detach();
  }

  /// The exception that tells Python the session stopped with `code`.
  [[noreturn]] void raise_stop(int code) {
    arm_stop_deadline(code);
    throw session_stopped{code, status().stop_reason, code == restart_code_};
  }

  /// In-place sum over the workers (Grace's abortable Gloo ring); float32.
  /// In a step abandoned by a recovery in place it does nothing (the step
  /// runs again; should_commit() says so).
  void all_reduce(uintptr_t ptr, size_t n) {
    alive();
    if (!attached_) throw grace_error("all_reduce_ before attach()");
    if (abandoned_ || s_->world_size() == 1 || n == 0) return;
    if (!comm_) connect();
    grace::status st;
    {
      py::gil_scoped_release nogil;
      st = comm_->allreduce_sum(reinterpret_cast<float*>(ptr), n);
    }
    if (!st && !recover_after(st.err().what())) throw collective_error("all_reduce_: " + st.err().what());
  }

  /// A collective failed in a session that recovers in place: the session
  /// decides at once. Recovered: the step is abandoned (the registered
  /// state untouched, the blobs put back to the last boundary's snapshot)
  /// and true. A stop: raised (exit_on_stop) or false for the caller to
  /// raise CollectiveError. Without in place: false.
  bool recover_after(const std::string& what) {
    if (!in_place_ || !in_step_) return false;
    const auto before = s_->recoveries();
    const auto completed = s_->completed_steps();
    grace::step_result r;
    {
      py::gil_scoped_release nogil;
      r = s_->fail_step("all_reduce_: " + what, true);
    }
    in_step_ = false;
    if (r == grace::step_result::ok && s_->recoveries() > before) {
      abandoned_ = true;
      checked_ = false;
      // Behind the donor, this rank took the donor's tensors and blobs
      // (its completed step moved): nothing of its own to put back.
      restore_pending_ = s_->completed_steps() == completed;
      return true;
    }
    on_stop();
    return false;
  }

  /// False in a step that a recovery in place abandoned: skip the update.
  bool should_commit() {
    checked_ = true;
    return !abandoned_;
  }
  /// At the boundary after an abandoned step: the trainer must have asked
  /// should_commit(), else it may have applied half-reduced gradients.
  void require_checked() {
    if (!abandoned_ || checked_) return;
    abandoned_ = false;
    throw grace_error(
        "a recovery in place abandoned this step, but the step never asked g.should_commit(): its update may "
        "have used half-reduced gradients, so this worker's state cannot be trusted. With recover_in_place=True, "
        "skip the rest of the step when g.should_commit() is False (after the last collective, before the update)");
  }

  void notify(const std::string& detail) {
    alive();
    s_->notify(detail);
  }

  /// Ends the session: its threads stop, the signal handlers and mask in
  /// place before it are put back. Idempotent.
  void close() {
    if (!s_) return;
    last_ = {s_->exit_code(), s_->stop_reason(), s_->rank(), s_->world_size(), s_->completed_steps()};
    recoveries_at_close_ = s_->recoveries();
    if (_Py_IsFinalizing()) {
      s_.reset();  // the interpreter is going away: no other thread runs Python
      comm_.reset();
    } else {
      py::gil_scoped_release nogil;
      s_.reset();  // disarms the abort handler before the communicator goes
      comm_.reset();
    }
    {
      std::lock_guard<std::mutex> g(aborts_->m);  // no handler is left to use them
      aborts_->comm.reset();
      aborts_->fds.clear();
    }
    blobs_.clear();
    notice_callbacks_.clear();
    keepalive_.clear();
    signals_.restore();
  }

  /// What a closed session still answers.
  struct final_status {
    int exit_code = 0;
    std::string stop_reason;
    uint32_t rank = 0, world_size = 1;
    uint64_t completed_steps = 0;
  };
  final_status status() const {
    if (!s_) return last_;
    return {s_->exit_code(), s_->stop_reason(), s_->rank(), s_->world_size(), s_->completed_steps()};
  }
  bool is_chief() const { return status().rank == 0; }
  uint64_t recoveries() const { return s_ ? s_->recoveries() : recoveries_at_close_; }
  bool attached() const { return attached_; }
  bool in_step() const { return in_step_; }
  bool stopped() const { return stopped_; }
  bool finished() const { return finished_; }
  bool closed() const { return !s_; }

private:
  void alive() const {
    if (!s_) throw grace_error("the session is closed");
  }
  struct blob {
    py::object snapshot, encode, restore, cached;
    bool have;
  };
  /// At a step boundary (trainer thread, GIL held): the notice callbacks.
  /// One that raises is reported and the others still run: a tracker's
  /// flush must not keep the save from happening.
  void deliver_notices() {
    if (!notices_->any.load(std::memory_order_acquire)) return;
    const auto callbacks = notice_callbacks_;  // a callback may register another, or close the session
    for (auto& [source, detail] : notices_->take())
      for (auto& cb : callbacks) try {
          cb(source, detail);
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("grace: a notice callback");
        }
    alive();  // closed by a callback: the boundary cannot go on
  }
  void capture_blobs() {
    deliver_notices();
    for (auto& b : blobs_) {
      b->cached = b->snapshot();
      b->have = true;
    }
  }
  void check_registration(const std::string& name) {
    alive();
    if (attached_)
      throw grace_error("cannot register '" + name + "' after attach(): register all state before attach()");
    if (name.empty()) throw py::value_error("empty name");
    if (!names_.insert(name).second) throw py::value_error("'" + name + "' is registered already");
  }
  void add(grace::tensor_ref t, py::object owner) {
    s_->register_tensor(std::move(t));
    keepalive_.push_back(std::move(owner));
  }
  void on_stop() {
    deliver_notices();  // a notice that arrived while the boundary waited
    stopped_ = true;
    if (exit_on_stop_) raise_stop(s_->exit_code());
  }
  void connect() {
    grace::status st;
    {
      py::gil_scoped_release nogil;
      st = connect_ring();
    }
    if (!st) throw collective_error("all_reduce_: gloo rendezvous failed: " + st.err().what());
  }
  /// Forms Grace's ring for the current group (no GIL needed).
  grace::status connect_ring() {
    auto token = std::make_shared<grace::cancel_token>();
    {
      std::lock_guard<std::mutex> g(aborts_->m);
      aborts_->rendezvous = token;  // a peer lost meanwhile ends the rendezvous at once
    }
    arm_abort();
    auto c = grace::gloo_comm::connect(s_->rendezvous_store(), s_->rendezvous_prefix() + "py.gloo",
                                       static_cast<int>(s_->rank()), static_cast<int>(s_->world_size()),
                                       collective_timeout_, s_->cluster().host, token);
    if (c) comm_ = std::move(c.value());
    {
      std::lock_guard<std::mutex> g(aborts_->m);
      aborts_->rendezvous.reset();
      if (c) aborts_->comm = comm_;
    }
    if (!c) return c.err();
    arm_abort();
    return {};
  }
  /// on_world_change: the aborted ring is dropped and a new one formed.
  grace::status reconnect() {
    {
      std::lock_guard<std::mutex> g(aborts_->m);
      aborts_->comm.reset();
    }
    comm_.reset();
    return connect_ring();
  }
  /// At the boundary after a step a recovery in place abandoned: every blob
  /// back to its snapshot of the last completed step (what the abandoned
  /// step drew from the RNGs, the batch it took), so the step runs again as
  /// it first ran.
  void restore_abandoned() {
    if (!restore_pending_) return;
    restore_pending_ = false;
    for (auto& b : blobs_) {
      if (!b->have) continue;
      py::object r = b->encode.is_none() ? b->cached : b->encode(b->cached);
      auto bytes = py::reinterpret_steal<py::object>(PyBytes_FromObject(r.ptr()));
      if (!bytes) throw py::error_already_set();
      b->restore(bytes);
    }
  }
  void arm_abort() {
    auto targets = aborts_;
    s_->set_abort_handler([targets] { targets->abort(); });
  }

public:
  /// Sockets a Python process group opened (see grace.Session.abortable_sockets):
  /// shut down when a peer is lost. Returns how many qualified.
  size_t add_abort_sockets(const std::vector<int>& fds, int skip_port) {
    alive();
    if (!attached_) throw grace_error("abortable_sockets() before attach()");
    size_t n = 0;
    {
      std::lock_guard<std::mutex> g(aborts_->m);
      for (int fd : fds)
        if (peer_socket(fd, skip_port)) {
          aborts_->fds.push_back(fd);
          ++n;
        }
    }
    if (n) arm_abort();
    return n;
  }

private:
  std::unique_ptr<grace::session> s_;
  bool exit_on_stop_ = true;
  std::chrono::milliseconds collective_timeout_;
  std::chrono::milliseconds stop_deadline_;
  bool deadline_armed_ = false;
  int restart_code_;
  std::optional<int> attach_exit_code_;
  std::shared_ptr<grace::gloo_comm> comm_;
  std::shared_ptr<abort_targets> aborts_ = std::make_shared<abort_targets>();
  std::shared_ptr<notice_queue> notices_ = std::make_shared<notice_queue>();
  std::vector<py::function> notice_callbacks_;
  std::deque<int64_t> counters_;
  std::vector<py::object> keepalive_;
  std::vector<std::unique_ptr<blob>> blobs_;
  std::set<std::string> names_;
  signal_state signals_;
  final_status last_;
  uint64_t recoveries_at_close_ = 0;
  bool attached_ = false, in_step_ = false, stopped_ = false, finished_ = false;
  bool in_place_ = false;   ///< on_world_change registered: a failed collective may recover in place
  bool abandoned_ = false;  ///< the step in flight was abandoned by a recovery in place
  bool checked_ = false;    ///< the trainer asked should_commit() in this step
  bool restore_pending_ = false;  ///< blobs to put back at the next boundary (restore_abandoned)
};

/// grace.Counter: an int64 saved in every checkpoint's manifest.
struct py_counter {
  int64_t* value;
  py::object owner;  ///< the session that holds the storage
};

/// The iterator behind `for step in g.steps(total)`.
struct py_steps {
  py_session* s;
  py::object owner;
  uint64_t total;
};

grace::options make_options(const py::kwargs& kw) {
  grace::options o;
  auto ms = [](const py::handle& v) { return std::chrono::milliseconds(v.cast<int64_t>()); };
  for (auto [k, v] : kw) {
    auto key = k.cast<std::string>();
    if (v.is_none()) continue;
    if (key == "checkpoint_dir")
      o.checkpoint_dir = v.cast<std::string>();
    else if (key == "keep_last")
      o.keep_last = v.cast<int>();
    else if (key == "restart_exit_code")
      o.restart_exit_code = v.cast<int>();
    else if (key == "save_every_steps")
      o.save_every_steps = v.cast<uint64_t>();
    else if (key == "save_every_seconds")
      o.save_every_seconds = v.cast<double>();
    else if (key == "save_every_auto")
      o.save_every_auto = v.cast<bool>();
    else if (key == "mtbf_prior_seconds")
      o.mtbf_prior_seconds = v.cast<double>();
    else if (key == "save_retry_max_ms")
      o.save_retry_max = std::chrono::milliseconds(v.cast<int64_t>());
    else if (key == "prune_on_save_failure")
      o.prune_on_save_failure = v.cast<bool>();
    else if (key == "fallback_checkpoint_dir")
      o.fallback_checkpoint_dir = v.cast<std::string>();
    else if (key == "keep_checkpoints_on_success")
      o.keep_checkpoints_on_success = v.cast<bool>();
    else if (key == "replicas")
      o.replicas = v.cast<bool>();
    else if (key == "notice_file")
      o.notice_file = v.cast<std::string>();
    else if (key == "notice_command")
      o.notice_command = v.cast<std::string>();
    else if (key == "poll_interval_ms")
      o.poll_interval = ms(v);
    else if (key == "grace_period_ms")
      o.grace_period = ms(v);
    else if (key == "wait_timeout_ms")
      o.wait_timeout = ms(v);
    else if (key == "connect_timeout_ms")
      o.connect_timeout = ms(v);
    else if (key == "heartbeat_ms")
      o.heartbeat = ms(v);
    else if (key == "dead_after_ms")
      o.dead_after = ms(v);
    else
      throw py::type_error("unknown session option '" + key + "'");
  }
  return o;
}

py::list list_checkpoints(const std::string& dir) {
  grace::checkpoint_store store(dir, 0);
  auto l = store.try_list();
  if (!l) throw grace_error(l.err().what());
  py::list out;
  for (auto& i : *l) {
    py::dict d;
    d["step"] = i.step;
    d["path"] = i.path.string();
    d["kind"] = i.kind;
    d["valid"] = i.valid;
    d["reason"] = i.reason;
    d["temporary"] = i.temporary;
    d["set_aside"] = i.set_aside;
    out.append(d);
  }
  return out;
}

void verify(const std::string& step_dir) {
  grace::checkpoint_store store(std::filesystem::path(step_dir).parent_path(), 0);
  grace::status st;
  {
    py::gil_scoped_release nogil;
    st = store.verify(std::filesystem::path(step_dir));
  }
  if (!st) throw grace_error(st.err().what());
}

}  // namespace

PYBIND11_MODULE(_grace, m) {
  m.doc() = "Grace's embedding API (the C++ grace::session); use the `grace` package, not this module.";
  auto& base = py::register_exception<grace_error>(m, "GraceError");
  py::register_exception<collective_error>(m, "CollectiveError", base.ptr());
  py::register_exception_translator(&translate_stop);
  m.def(
      "_set_stop_classes",
      [](py::object stopped, py::object preempted) {
        for (PyObject* c : g_stop_classes) Py_XDECREF(c);
        g_stop_classes[0] = stopped.inc_ref().ptr();
        g_stop_classes[1] = preempted.inc_ref().ptr();
      },
      "grace.Stopped and grace.Preempted, which a stop raises (set by the grace package at import).");
  m.attr("RESTART") = grace::exit_code::restart;
  m.attr("FATAL") = grace::exit_code::fatal;
  m.attr("USAGE") = grace::exit_code::usage;
  m.attr("MAX_BLOB_BYTES") = grace::max_blob_bytes;
  m.def(
      "_await_standby",
      []() -> std::optional<grace::env_map> {
        auto r = [] {
          py::gil_scoped_release nogil;
          return grace::await_standby_release();
        }();
        if (!r) throw grace_error(r.err().what());
        return *r;
      },
      "In a warm spare of grace-launch --standby: block until released; the variables set (else None).");

  py::class_<py_counter>(m, "Counter")
      .def_property(
          "value", [](const py_counter& c) { return *c.value; }, [](py_counter& c, int64_t v) { *c.value = v; })
      .def("__int__", [](const py_counter& c) { return *c.value; })
      .def("__index__", [](const py_counter& c) { return *c.value; })
      .def("__repr__", [](const py_counter& c) { return "Counter(" + std::to_string(*c.value) + ")"; });

  py::class_<py_steps>(m, "Steps")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](py_steps& it) {
        uint64_t k = it.s->next_step(it.total);
        if (k == 0) throw py::stop_iteration();
        return k;
      });

  py::class_<py_session>(m, "Session")
      .def(py::init([](bool exit_on_stop, int collective_timeout_ms, int stop_deadline_ms, bool recover_in_place,
                       py::kwargs kw) {
             return std::make_unique<py_session>(make_options(kw), exit_on_stop, collective_timeout_ms,
                                                 stop_deadline_ms, recover_in_place);
           }),
           py::arg("exit_on_stop") = true, py::arg("collective_timeout_ms") = 30000,
           py::arg("stop_deadline_ms") = 10000, py::arg("recover_in_place") = false)
      .def("register_memory", &py_session::register_memory, py::arg("name"), py::arg("dtype"), py::arg("shape"),
           py::arg("ptr"), py::arg("owner"), py::arg("global_shape") = std::vector<int64_t>{},
           py::arg("offsets") = std::vector<int64_t>{})
      .def("register_buffer", &py_session::register_buffer, py::arg("name"), py::arg("array"),
           py::arg("global_shape") = std::vector<int64_t>{}, py::arg("offsets") = std::vector<int64_t>{})
      .def(
          "counter",
          [](py::object self, const std::string& name, int64_t initial) {
            return py_counter{self.cast<py_session&>().counter(name, initial), self};
          },
          py::arg("name"), py::arg("initial") = 0)
      .def("register_blob", &py_session::register_blob, py::arg("name"), py::arg("snapshot"), py::arg("encode"),
           py::arg("restore"))
      .def("attach", &py_session::attach)
      .def(
          "steps",
          [](py::object self, uint64_t total) {
            return py_steps{&self.cast<py_session&>(), self, total};
          },
          py::arg("total"))
      .def("begin_step", &py_session::begin_step)
      .def("end_step", &py_session::end_step)
      .def("fail_step", &py_session::fail_step, py::arg("what"), py::arg("collective") = false)
      .def("finish", &py_session::finish)
      .def("quick_exit", &py_session::quick_exit, py::arg("code"))
      .def("arm_stop_deadline", &py_session::arm_stop_deadline, py::arg("code"))
      .def("should_commit", &py_session::should_commit)
      .def_property_readonly("recoveries", [](py_session& s) { return s.recoveries(); })
      .def("all_reduce", &py_session::all_reduce, py::arg("ptr"), py::arg("n"))
      .def("add_abort_sockets", &py_session::add_abort_sockets, py::arg("fds"), py::arg("skip_port") = -1)
      .def("notify", &py_session::notify, py::arg("detail") = "notify() from Python")
      .def("on_notice", &py_session::on_notice, py::arg("callback"))
      .def("close", &py_session::close)
      .def_property_readonly("attached", &py_session::attached)
      .def_property_readonly("in_step", &py_session::in_step)
      .def_property_readonly("stopped", &py_session::stopped)
      .def_property_readonly("attach_exit_code", &py_session::attach_exit_code)
      .def_property_readonly("finished", &py_session::finished)
      .def_property_readonly("closed", &py_session::closed)
      .def_property_readonly("exit_code", [](py_session& s) { return s.status().exit_code; })
      .def_property_readonly("stop_reason", [](py_session& s) { return s.status().stop_reason; })
      .def_property_readonly("rank", [](py_session& s) { return s.status().rank; })
      .def_property_readonly("world_size", [](py_session& s) { return s.status().world_size; })
      .def_property_readonly("is_chief", &py_session::is_chief)
      .def_property_readonly("completed_steps", [](py_session& s) { return s.status().completed_steps; });

  m.def("list_checkpoints", &list_checkpoints, py::arg("dir"),
        "Every step-* and leftover .tmp-* directory under `dir`, oldest first (quick check, no checksums).");
  m.def(
      "set_log_level",
      [](const std::string& level) {
        auto l = spdlog::level::from_str(level);
        if (l == spdlog::level::off && level != "off")
          throw py::value_error("log level '" + level + "': trace, debug, info, warn, error, critical or off");
        spdlog::set_level(l);
      },
      py::arg("level"), "Level of Grace's log lines (default info).");
  m.def("verify", &verify, py::arg("step_dir"),
        "Verifies one checkpoint directory (every file's size and xxh3 checksum); raises GraceError if bad.");
}
