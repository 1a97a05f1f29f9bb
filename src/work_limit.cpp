// A work limit for llama.cpp's Jinja engine, which has no hook of its own: a template can loop
// for as long as it likes, and renders while it is analysed with no way to stop it.
//
// Every value, scope and string part the engine makes is a C++ allocation, so counting them
// bounds its work. The extension is linked with `--wrap` for `operator new` (build.rs): while a
// thread has a limit (`llamactx_work_limit_begin`), each of its allocations is counted, and once
// the count, the bytes or an interruption say stop, the next allocation made outside exception
// handling throws. The limit stays reached until it ends, so llama.cpp code that catches
// exceptions and renders again (the template's capability analysis does) stops again at once,
// while its handlers, which run with an exception being handled, allocate freely.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>

extern "C" void * __real__Znwm(std::size_t size);
extern "C" void * __real__Znam(std::size_t size);

namespace {

// How many allocations pass between two polls of the interruption callback.
constexpr std::uint64_t POLL_EVERY = 4096;

enum stop_reason : int { RUNNING = 0, EXCEEDED = 1, INTERRUPTED = 2 };

struct work_limit {
    bool active = false;
    std::uint64_t allocations_left = 0;
    std::uint64_t bytes_left = 0;
    bool (*interrupted)() = nullptr;
    std::uint64_t until_poll = POLL_EVERY;
    stop_reason stopped = RUNNING;
    // Set while the error is being made: its own allocations must not throw.
    bool raising = false;
};

thread_local work_limit limit;

class work_limit_error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

void spend(std::size_t size) {
    if (!limit.active || limit.raising) {
        return;
    }
    if (limit.stopped == RUNNING) {
        if (limit.allocations_left == 0 || size > limit.bytes_left) {
            limit.stopped = EXCEEDED;
        } else {
            limit.allocations_left -= 1;
            limit.bytes_left -= size;
            if (--limit.until_poll == 0) {
                limit.until_poll = POLL_EVERY;
                if (limit.interrupted != nullptr && limit.interrupted()) {
                    limit.stopped = INTERRUPTED;
                }
            }
        }
    }
    // Throwing while an exception unwinds would terminate the process, and a handler must be
    // able to report the error it caught.
    if (limit.stopped != RUNNING && std::uncaught_exceptions() == 0 && !std::current_exception()) {
        limit.raising = true;
        work_limit_error error(limit.stopped == INTERRUPTED ? "the chat template was interrupted"
                                                            : "the chat template exceeded its work limit");
        limit.raising = false;
        throw error;
    }
}

}  // namespace

extern "C" void * __wrap__Znwm(std::size_t size) {
    spend(size);
    return __real__Znwm(size);
}

extern "C" void * __wrap__Znam(std::size_t size) {
    spend(size);
    return __real__Znam(size);
}

// Starts counting this thread's allocations: at most `allocations` of them and `bytes` in all;
// `interrupted` (may be null) is polled as they go.
extern "C" void llamactx_work_limit_begin(std::uint64_t allocations, std::uint64_t bytes, bool (*interrupted)()) {
    limit = work_limit{};
    limit.allocations_left = allocations;
    limit.bytes_left = bytes;
    limit.interrupted = interrupted;
    limit.active = true;
}

// Stops counting; returns why the work stopped early (0: it did not, 1: the limit, 2: an
// interruption).
extern "C" int llamactx_work_limit_end() {
    const int stopped = limit.stopped;
    limit = work_limit{};
    return stopped;
}
