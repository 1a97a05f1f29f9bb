// A work limit for llama.cpp's Jinja engine, which has no hook of its own: a template can loop
// for as long as it likes, and renders while it is analysed with no way to stop it.
//
// Every value, scope and string part the engine makes is a C++ allocation, so counting them
// bounds its work. The extension is linked with `--wrap` for `operator new` (build.rs): while a
// thread has a limit (`llamactx_work_limit_begin`), each of its allocations is counted, and once
// the count, the bytes, the time, the heap's growth or an interruption say stop, the next
// allocation made outside exception handling throws. The limit stays reached until it ends, so
// llama.cpp code that catches exceptions and renders again (the template's capability analysis
// does) stops again soon, while its handlers, which run with an exception being handled, allocate
// freely, and so do the next 1,024 allocations after each throw: the analysis catches the error,
// then destroys JSON values, whose destructors allocate in `noexcept` frames.
//
// Two things the count cannot see are polled as it goes: the time (string work such as
// `replace` on a long text costs much and allocates little) and the process's heap (the C++
// runtime's own string code allocates through its own `operator new`, which `--wrap` does not
// reach when it is a shared library). And a throw in a `noexcept` frame ends in `std::terminate`,
// wherever the allocations after a throw run out: a limited call runs on a thread of its own
// (work_limit.rs), so the terminate handler strands that thread instead of ending the process: it
// tells the waiting caller, then sleeps for good.

#include <dlfcn.h>
#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <stdexcept>

extern "C" void * __real__Znwm(std::size_t size);
extern "C" void * __real__Znam(std::size_t size);

namespace {

// How many allocations pass after a throw before the next: code that caught the error runs on
// (its destructors, which are noexcept, may allocate), and the next render it starts stops soon.
constexpr std::uint64_t ALLOCATIONS_AFTER_A_THROW = 1024;
// How many allocations, or nanoseconds, pass between two polls of what the count cannot see.
constexpr std::uint64_t POLL_EVERY = 4096;
constexpr std::uint64_t POLL_NANOS = 1000000;

enum stop_reason : int { RUNNING = 0, EXCEEDED = 1, INTERRUPTED = 2, OUT_OF_TIME = 3, HEAP_GREW = 4 };

struct work_limit {
    bool active = false;
    std::uint64_t allocations_left = 0;
    std::uint64_t bytes_left = 0;
    bool (*interrupted)() = nullptr;
    // CLOCK_MONOTONIC nanoseconds.
    std::uint64_t deadline = 0;
    std::uint64_t next_poll = 0;
    std::uint64_t until_poll = POLL_EVERY;
    // Set by the caller when it stops waiting (a Rust AtomicBool).
    const bool * abandoned = nullptr;
    std::uint64_t heap_at_start = 0;
    std::uint64_t heap_growth = 0;
    // Called by the terminate handler on this thread, before it strands it.
    void (*stranded)(void *) = nullptr;
    void * stranded_data = nullptr;
    stop_reason stopped = RUNNING;
    std::uint64_t until_next_throw = 0;
    // Set while the error is being made: its own allocations must not throw.
    bool raising = false;
};

thread_local work_limit limit;

class work_limit_error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

std::uint64_t now() {
    timespec time{};
    clock_gettime(CLOCK_MONOTONIC, &time);
    return static_cast<std::uint64_t>(time.tv_sec) * 1000000000 + static_cast<std::uint64_t>(time.tv_nsec);
}

// glibc's `mallinfo2` (2.33 on); the wheel's builds link against an older glibc, so it is found
// at run time, with `mallinfo` (whose counts wrap at 4 GiB) where it is missing.
struct mallinfo2_fields {
    std::size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};

std::uint64_t heap_in_use() {
    using mallinfo2_fn = mallinfo2_fields (*)();
    static const auto mallinfo2 = reinterpret_cast<mallinfo2_fn>(dlsym(RTLD_DEFAULT, "mallinfo2"));
    if (mallinfo2 != nullptr) {
        const mallinfo2_fields info = mallinfo2();
        return info.uordblks + info.hblkhd;
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    const struct mallinfo info = mallinfo();
#pragma GCC diagnostic pop
    return static_cast<unsigned>(info.uordblks) + static_cast<unsigned>(info.hblkhd);
}

stop_reason poll() {
    if (limit.interrupted != nullptr && limit.interrupted()) {
        return INTERRUPTED;
    }
    if (now() >= limit.deadline || (limit.abandoned != nullptr && __atomic_load_n(limit.abandoned, __ATOMIC_ACQUIRE))) {
        return OUT_OF_TIME;
    }
    if (heap_in_use() > limit.heap_at_start + limit.heap_growth) {
        return HEAP_GREW;
    }
    return RUNNING;
}

const char * message(stop_reason reason) {
    switch (reason) {
        case INTERRUPTED:
            return "the chat template was interrupted";
        case OUT_OF_TIME:
            return "the chat template ran out of time";
        case HEAP_GREW:
            return "the chat template's memory grew past its limit";
        default:
            return "the chat template exceeded its work limit";
    }
}

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
            const std::uint64_t time = now();
            if (--limit.until_poll == 0 || time >= limit.next_poll) {
                limit.until_poll = POLL_EVERY;
                limit.next_poll = time + POLL_NANOS;
                limit.stopped = poll();
            }
        }
    }
    // Throwing while an exception unwinds would terminate the process, and a handler must be
    // able to report the error it caught.
    if (limit.stopped != RUNNING && std::uncaught_exceptions() == 0 && !std::current_exception()) {
        if (limit.until_next_throw > 0) {
            limit.until_next_throw -= 1;
            return;
        }
        limit.until_next_throw = ALLOCATIONS_AFTER_A_THROW;
        limit.raising = true;
        work_limit_error error(message(limit.stopped));
        limit.raising = false;
        throw error;
    }
}

std::terminate_handler previous_terminate = nullptr;

[[noreturn]] void strand_or_terminate() {
    if (limit.active && limit.stranded != nullptr) {
        limit.stranded(limit.stranded_data);
        for (;;) {
            pause();
        }
    }
    if (previous_terminate != nullptr) {
        previous_terminate();
    }
    std::abort();
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

// Starts counting this thread's allocations: at most `allocations` of them and `bytes` in all,
// for at most `nanos` nanoseconds, while the process's heap grows by at most `heap_growth`
// bytes; `interrupted` (may be null) and `*abandoned` are polled as they go. A `std::terminate`
// on this thread until the limit ends calls `stranded(stranded_data)` and never returns.
extern "C" void llamactx_work_limit_begin(std::uint64_t allocations, std::uint64_t bytes, std::uint64_t nanos,
                                          std::uint64_t heap_growth, bool (*interrupted)(), const bool * abandoned,
                                          void (*stranded)(void *), void * stranded_data) {
    static const bool installed = (previous_terminate = std::set_terminate(strand_or_terminate), true);
    (void) installed;
    limit = work_limit{};
    limit.allocations_left = allocations;
    limit.bytes_left = bytes;
    limit.interrupted = interrupted;
    const std::uint64_t start = now();
    limit.deadline = nanos > UINT64_MAX - start ? UINT64_MAX : start + nanos;
    limit.next_poll = start + POLL_NANOS;
    limit.abandoned = abandoned;
    limit.heap_at_start = heap_in_use();
    limit.heap_growth = heap_growth;
    limit.stranded = stranded;
    limit.stranded_data = stranded_data;
    limit.active = true;
}

// Stops counting; returns why the work stopped early (0: it did not, 1: the count or the bytes,
// 2: an interruption, 3: the time, 4: the heap's growth).
extern "C" int llamactx_work_limit_end() {
    const int stopped = limit.stopped;
    limit = work_limit{};
    return stopped;
}
