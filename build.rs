//! Compiles the work limit of llama.cpp's Jinja engine (`src/work_limit.cpp`) and wraps
//! `operator new` with it: every allocation of the C++ code linked into the extension passes
//! through the limit, which counts only while a thread has one. Also wraps mtmd's bitmap
//! constructors (`src/mtmd_exceptions.cpp`), so that a C++ exception becomes their failure.

fn main() {
    println!("cargo:rerun-if-changed=src/work_limit.cpp");
    println!("cargo:rerun-if-changed=src/mtmd_exceptions.cpp");
    cc::Build::new()
        .cpp(true)
        // llama-cpp-sys-4 links the C++ runtime it was built with (libstdc++, or zig's libc++).
        .cpp_link_stdlib(None)
        .std("c++17")
        .file("src/work_limit.cpp")
        .file("src/mtmd_exceptions.cpp")
        .compile("llamactx_cpp_guards");
    for symbol in ["_Znwm", "_Znam", "mtmd_bitmap_init", "mtmd_bitmap_init_from_audio"] {
        println!("cargo:rustc-link-arg=-Wl,--wrap={symbol}");
    }
}
