// mtmd's bitmap constructors copy the pixels or samples into a `std::vector` without catching
// what that throws: a `std::bad_alloc` escaping an `extern "C"` function into Rust ends the
// process ("Rust cannot catch foreign exceptions"). The linker sends the extension's calls to
// these wrappers (`--wrap`, see build.rs), which catch any exception, log its message as a
// llama.cpp error (so that the caller's `explained` reports it) and return null, the failure the
// crate already checks for. mtmd's tokenize and encode calls catch their own exceptions.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>

struct mtmd_bitmap;

// ggml's log callback type; `enum ggml_log_level` is an int, and 4 is GGML_LOG_LEVEL_ERROR.
typedef void (*log_callback)(int level, const char *text, void *user_data);
static const int LOG_LEVEL_ERROR = 4;

extern "C" {
void llama_log_get(log_callback *callback, void **user_data);
mtmd_bitmap *__real_mtmd_bitmap_init(uint32_t nx, uint32_t ny, const unsigned char *data);
mtmd_bitmap *__real_mtmd_bitmap_init_from_audio(size_t n_samples, const float *data);
}

// Formats on the stack: after a `std::bad_alloc`, the heap may have nothing to give.
static void log_exception(const char *call, const char *what) {
    log_callback callback = nullptr;
    void *user_data = nullptr;
    llama_log_get(&callback, &user_data);
    if (callback == nullptr) {
        return;
    }
    char line[512];
    std::snprintf(line, sizeof line, "%s threw a C++ exception: %s\n", call, what);
    callback(LOG_LEVEL_ERROR, line, user_data);
}

template <typename Call> static mtmd_bitmap *catching(const char *name, Call call) {
    try {
        return call();
    } catch (const std::exception &error) {
        log_exception(name, error.what());
    } catch (...) {
        log_exception(name, "of an unknown type");
    }
    return nullptr;
}

extern "C" {

mtmd_bitmap *__wrap_mtmd_bitmap_init(uint32_t nx, uint32_t ny, const unsigned char *data) {
    return catching("mtmd_bitmap_init", [&] { return __real_mtmd_bitmap_init(nx, ny, data); });
}

mtmd_bitmap *__wrap_mtmd_bitmap_init_from_audio(size_t n_samples, const float *data) {
    return catching("mtmd_bitmap_init_from_audio", [&] { return __real_mtmd_bitmap_init_from_audio(n_samples, data); });
}
}
